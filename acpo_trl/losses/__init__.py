"""Policy losses: pure tensor functions, one per method, in a registry (see :mod:`.registry`).

Importing this package registers every built-in method.
"""

from .acpo import BinClipRule, BinStats, acpo_clip_range, acpo_log_loss, acpo_loss, probability_bins
from .aggregation import LOSS_TYPES, AggregatedLoss, aggregate_loss
from .cispo import masked_cispo_loss, trl_cispo_loss
from .dcpo import dcpo_bounds, dcpo_loss
from .common import IMPORTANCE_SAMPLING_LEVELS, clipped_surrogate, importance_ratio, policy_ratio
from .entropy import entropy_rank_mask, high_entropy_loss, low_entropy_loss
from .lopti import ar_lopti_loss
from .ppo import dapo_loss, fixed_clip_loss, ppo_clip_loss, unclipped_loss
from .sapo import sapo_loss
from .vespo import vespo_loss
from .registry import (
    NEEDS,
    POLICY_LOSSES,
    PolicyLoss,
    PolicyLossInputs,
    PolicyLossOutput,
    epsilon_high,
    flatten_metrics,
    get_policy_loss,
    reduce_metrics,
    register_policy_loss,
)
from .reweight import dlogp_reweight_loss, dlogp_weights, dominate_loss, dominate_weights, ppl_loss, ppl_weights

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "NEEDS",
    "POLICY_LOSSES",
    "AggregatedLoss",
    "BinClipRule",
    "BinStats",
    "PolicyLoss",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "acpo_clip_range",
    "acpo_log_loss",
    "acpo_loss",
    "aggregate_loss",
    "ar_lopti_loss",
    "clipped_surrogate",
    "dapo_loss",
    "dcpo_bounds",
    "dcpo_loss",
    "dlogp_reweight_loss",
    "dlogp_weights",
    "dominate_loss",
    "dominate_weights",
    "epsilon_high",
    "entropy_rank_mask",
    "fixed_clip_loss",
    "flatten_metrics",
    "get_policy_loss",
    "high_entropy_loss",
    "importance_ratio",
    "low_entropy_loss",
    "masked_cispo_loss",
    "ppl_loss",
    "ppl_weights",
    "policy_ratio",
    "ppo_clip_loss",
    "probability_bins",
    "reduce_metrics",
    "register_policy_loss",
    "sapo_loss",
    "trl_cispo_loss",
    "unclipped_loss",
    "vespo_loss",
]
