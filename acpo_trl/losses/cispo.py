"""CISPO, clipped importance-sampling-weight policy optimisation (MiniMax-M1, arXiv 2506.13585), under two names
for its two rules:

    trl_cispo      l = -A * sg(min(r, epsilon_high)) * log pi_theta(y_t)              TRL's ``loss_type="cispo"``
    masked_cispo   l = -A * sg(clamp(r, 0, cispo_clip_max)) * log pi_theta(y_t), and 0 on the tokens outside PPO's
                   trust region in the direction of their advantage: (A > 0, r > 1 + epsilon_high) or
                   (A < 0, r < 1 - epsilon)                                               the ACPO authors' CISPO

The gradient is the REINFORCE gradient weighted by the clamped, detached ratio, so no token's gradient is zeroed by
a clip. ``trl_cispo`` caps the weight at TRL's ``epsilon_high`` (a ratio, not 1 + a range: TRL's docs and ScaleRL set
5.0, the value taken when it is unset); aggregated with ``loss_type="dapo"`` it is TRL's ``loss_type="cispo"`` loss.
``masked_cispo`` is what the ACPO authors ran: the cap ``cispo_clip_max`` (1.45) and a mask on [1 - epsilon,
1 + epsilon_high], TRL's clip vocabulary as their launcher's clip_ratio_low / clip_ratio_high (0.2 / 0.3; 0.3 when
``epsilon_high`` is unset). No dual clip, no ``delta``; dropped tokens keep their place in the denominator.
"""

from __future__ import annotations

import torch

from .common import importance_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, epsilon_high, register_policy_loss

TRL_CISPO_CAP = 5.0  # TRL's docs and ScaleRL, when epsilon_high is unset
MASK_EPSILON_HIGH = 0.3  # the ACPO authors' launcher, when epsilon_high is unset


def weighted_log_prob_loss(inputs: PolicyLossInputs, weights: torch.Tensor) -> torch.Tensor:
    """-A * sg(w) * log pi_theta(y_t): the REINFORCE loss weighted by detached per-token (or per-sequence) weights."""
    return -inputs.advantages * weights.detach() * inputs.logps


def validate_masked_cispo(config) -> None:
    if config.cispo_clip_max <= 0:
        raise ValueError(f"ACPOConfig.cispo_clip_max={config.cispo_clip_max!r}: must be > 0 (the ACPO authors use 1.45).")
    if not config.epsilon < 1:
        raise ValueError(f"ACPOConfig.epsilon={config.epsilon!r}: masked_cispo drops A < 0 tokens with r < 1 - "
                         "epsilon; give epsilon < 1 (the authors' 0.2).")


@register_policy_loss("masked_cispo", validate=validate_masked_cispo, unset={"epsilon_high": MASK_EPSILON_HIGH},
                      reads=("epsilon", "epsilon_high", "cispo_clip_max"),
                      summary="REINFORCE weighted by sg(clamp(r, 0, cispo_clip_max)); tokens outside [1 - epsilon, 1 "
                              "+ epsilon_high] in their advantage's direction dropped, as the ACPO authors ran CISPO",
                      source="MiniMax-M1 (2506.13585), the ACPO authors' version")
def masked_cispo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """See the module docstring; defaults: cap 1.45, mask [0.8, 1.3]."""
    advantages, mask = inputs.advantages, inputs.mask
    ratio = importance_ratio(inputs.logps, inputs.old_logps).detach()
    loss = weighted_log_prob_loss(inputs, torch.clamp(ratio, 0, config.cispo_clip_max))
    with torch.no_grad():
        dropped_high = (advantages > 0) & (ratio > 1 + epsilon_high(config, "masked_cispo"))
        dropped_low = (advantages < 0) & (ratio < 1 - config.epsilon)
        clamped = (ratio > config.cispo_clip_max) & (advantages != 0)
    loss = loss.masked_fill(dropped_high | dropped_low, 0.0)
    num_tokens = mask.sum()
    metrics = {
        "cispo/mask_frac": (((dropped_high | dropped_low) * mask).sum(), num_tokens),
        "cispo/weight_clip_frac": ((clamped * mask).sum(), num_tokens),
    }
    return PolicyLossOutput(loss, metrics, dropped_high, dropped_low)


def validate_trl_cispo(config) -> None:
    if config.epsilon_high is not None and config.epsilon_high <= 0:
        raise ValueError(f"ACPOConfig.epsilon_high={config.epsilon_high!r}: trl_cispo caps the weight r at "
                         "epsilon_high; give a cap > 0 (TRL's docs: 5.0).")


@register_policy_loss("trl_cispo", validate=validate_trl_cispo, unset={"epsilon_high": TRL_CISPO_CAP},
                      reads=("epsilon_high",),
                      summary="REINFORCE weighted by sg(min(r, epsilon_high)), no mask: TRL's `loss_type: cispo` "
                              "(equal to it with `loss_type: dapo`)",
                      source="MiniMax-M1 (2506.13585), as TRL computes it")
def trl_cispo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """TRL's CISPO (module docstring); its clip masks are TRL's clip metric, A > 0 tokens whose weight was capped."""
    mask = inputs.mask
    ratio = importance_ratio(inputs.logps, inputs.old_logps).detach()
    cap = epsilon_high(config, "trl_cispo")
    loss = weighted_log_prob_loss(inputs, torch.clamp(ratio, max=cap))
    with torch.no_grad():
        capped = ratio > cap
        capped_high = capped & (inputs.advantages > 0)
    metrics = {"cispo/weight_clip_frac": (((capped & (inputs.advantages != 0)) * mask).sum(), mask.sum())}
    return PolicyLossOutput(loss, metrics, capped_high, torch.zeros_like(capped_high))
