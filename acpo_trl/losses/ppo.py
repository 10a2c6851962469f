"""Fixed-epsilon clipped objectives: ``ppo_clip`` (TRL's GRPO clip) and ``dapo`` (clip-higher)."""

from __future__ import annotations

from .common import clip_ratio_metrics, clipped_surrogate, importance_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, register_policy_loss


def fixed_clip_loss(
    inputs: PolicyLossInputs,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
    ratio_max: float | None = None,
) -> PolicyLossOutput:
    """l = max(-A r', -A clamp(r, 1 - eps_low, 1 + eps_high)), dual-clipped at -c A for A < 0 when c is set;
    r' = min(r, ratio_max) when TRL's ``delta`` is set."""
    ratio = importance_ratio(inputs.logps, inputs.old_logps)
    out = clipped_surrogate(ratio, inputs.advantages, 1 - eps_low, 1 + eps_high, dual_clip_c, ratio_max=ratio_max)
    mask = inputs.mask
    metrics = clip_ratio_metrics((out.clipped_low * mask).sum(), (out.clipped_high * mask).sum(), mask.sum())
    return PolicyLossOutput(out.loss, metrics, out.clipped_high, out.clipped_low)


@register_policy_loss("ppo_clip")
def ppo_clip_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """TRL's GRPO clip: range [1 - epsilon, 1 + epsilon_high] (epsilon_high defaults to epsilon), TRL's
    ``delta`` cap included, plus dual-clip when ``dual_clip_c`` is set. With ``dual_clip_c=None`` this is
    TRL's per-token loss for ``loss_type`` in {grpo, bnpo, dr_grpo, dapo}."""
    eps_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    return fixed_clip_loss(inputs, config.epsilon, eps_high, config.dual_clip_c, ratio_max=config.delta)


@register_policy_loss("dapo")
def dapo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """DAPO's clip-higher (Yu et al. 2025) alone: range [1 - dapo_clip_low, 1 + dapo_clip_high], dual-clip.

    Defaults 0.2 / 0.3 as the ACPO authors ran it, with the run's own aggregation. The DAPO paper's recipe is
    0.2 / 0.28 with ``loss_type="dapo"`` (token-mean), plus dynamic sampling and overlong shaping (not here).
    """
    return fixed_clip_loss(inputs, config.dapo_clip_low, config.dapo_clip_high, config.dual_clip_c, config.delta)
