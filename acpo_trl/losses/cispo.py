"""``cispo``: clipped importance-sampling-weight policy optimisation (MiniMax-M1, arXiv 2506.13585).

    l = -A * sg(clamp(r, 0, cispo_clip_max)) * log pi_theta(y_t)

The gradient is the REINFORCE gradient weighted by the clamped, detached ratio, so no token's gradient is
zeroed by a clip. The ACPO authors' version (``cispo_mask=True``, their runs) also drops the tokens outside
PPO's trust region in the direction of their advantage: (A > 0 and r > cispo_mask_high) or
(A < 0 and r < cispo_mask_low); those are its clip masks. ``cispo_mask=False`` is TRL's ``loss_type="cispo"``
per-token loss (with ``epsilon_high`` = ``cispo_clip_max``). No dual-clip. Dropped tokens keep their place in the
denominator.
"""

from __future__ import annotations

import torch

from .common import importance_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, register_policy_loss


def validate_cispo(config) -> None:
    if config.cispo_clip_max <= 0:
        raise ValueError(f"ACPOConfig.cispo_clip_max={config.cispo_clip_max!r}: must be > 0 (the ACPO authors use 1.45).")
    if not config.cispo_mask_low < 1 < config.cispo_mask_high:
        raise ValueError(f"ACPOConfig.cispo_mask_low={config.cispo_mask_low!r}: the CISPO trust region needs "
                         f"cispo_mask_low < 1 < cispo_mask_high (got {config.cispo_mask_low}, {config.cispo_mask_high}).")
    if config.delta is not None:
        raise ValueError(f"ACPOConfig.delta={config.delta!r}: CISPO has no clipped surrogate for TRL's ratio cap to "
                         "act on (its weight is already clamped at cispo_clip_max); leave delta unset.")


@register_policy_loss("cispo", validate=validate_cispo)
def cispo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """See the module docstring; defaults: clamp max 1.45, mask (0.8, 1.3) on."""
    advantages, mask = inputs.advantages, inputs.mask
    ratio = importance_ratio(inputs.logps, inputs.old_logps).detach()
    loss = -advantages * torch.clamp(ratio, 0, config.cispo_clip_max) * inputs.logps
    with torch.no_grad():
        dropped_high = (advantages > 0) & (ratio > config.cispo_mask_high) & config.cispo_mask
        dropped_low = (advantages < 0) & (ratio < config.cispo_mask_low) & config.cispo_mask
        clamped = (ratio > config.cispo_clip_max) & (advantages != 0)
    loss = loss.masked_fill(dropped_high | dropped_low, 0.0)
    num_tokens = mask.sum()
    metrics = {
        "cispo/mask_frac": (((dropped_high | dropped_low) * mask).sum(), num_tokens),
        "cispo/weight_clip_frac": ((clamped * mask).sum(), num_tokens),
    }
    return PolicyLossOutput(loss, metrics, dropped_high, dropped_low)
