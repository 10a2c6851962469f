"""Policy losses: pure tensor functions, one per method, in a registry (see :mod:`.registry`).

Importing this package registers every built-in method.
"""

from .acpo import BinStats, acpo_clip_range, acpo_loss, bin_clip_range, probability_bins, token_clip_range
from .aggregation import LOSS_TYPES, aggregate_loss
from .common import clipped_surrogate, importance_ratio
from .cispo import cispo_loss
from .entropy import high_entropy_loss, low_entropy_loss, top_entropy_mask
from .lopti import ar_lopti_loss
from .ppo import dapo_loss, fixed_clip_loss, ppo_clip_loss
from .reweight import REWEIGHTINGS, dlogp_reweight_loss, dlogp_weights, dominate_loss, dominate_weights, ppl_loss, ppl_weights
from .registry import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    flatten_metrics,
    get_policy_loss,
    register_policy_loss,
)

__all__ = [
    "BinStats",
    "LOSS_TYPES",
    "POLICY_LOSSES",
    "REWEIGHTINGS",
    "ar_lopti_loss",
    "cispo_loss",
    "dapo_loss",
    "dlogp_reweight_loss",
    "dlogp_weights",
    "dominate_loss",
    "dominate_weights",
    "fixed_clip_loss",
    "flatten_metrics",
    "high_entropy_loss",
    "low_entropy_loss",
    "ppl_loss",
    "ppl_weights",
    "top_entropy_mask",
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
