"""Policy losses: pure tensor functions, one per method, in a registry (see :mod:`.registry`).

Importing this package registers every built-in method.
"""

from .acpo import BinStats, acpo_clip_range, acpo_loss, bin_clip_range, probability_bins, token_clip_range
from .aggregation import LOSS_TYPES, aggregate_loss
from .common import clipped_surrogate, importance_ratio
from .ppo import ppo_clip_loss
from .registry import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    get_policy_loss,
    register_policy_loss,
)

__all__ = [
    "BinStats",
    "LOSS_TYPES",
    "POLICY_LOSSES",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "acpo_clip_range",
    "acpo_loss",
    "bin_clip_range",
    "aggregate_loss",
    "clipped_surrogate",
    "get_policy_loss",
    "importance_ratio",
    "ppo_clip_loss",
    "probability_bins",
    "token_clip_range",
    "register_policy_loss",
]
