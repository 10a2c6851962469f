"""``ppo_clip``: the fixed-epsilon clipped objective of GRPO/PPO, as TRL's GRPOTrainer computes it."""

from __future__ import annotations

from .common import clip_ratio_metrics, clipped_surrogate, importance_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, register_policy_loss


@register_policy_loss("ppo_clip")
def ppo_clip_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """l = max(-A r, -A clamp(r, 1 - epsilon, 1 + epsilon_high)), plus dual-clip when ``dual_clip_c`` is set.

    With ``dual_clip_c=None`` this is TRL's ``loss_type`` in {grpo, bnpo, dr_grpo, dapo} per-token loss,
    ``delta`` (TRL's cap on the unclipped ratio) included.
    """
    eps_low = config.epsilon
    eps_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    ratio = importance_ratio(inputs.logps, inputs.old_logps)
    out = clipped_surrogate(
        ratio, inputs.advantages, 1 - eps_low, 1 + eps_high, config.dual_clip_c, ratio_max=config.delta
    )
    mask = inputs.mask
    metrics = clip_ratio_metrics((out.clipped_low * mask).sum(), (out.clipped_high * mask).sum(), mask.sum())
    return PolicyLossOutput(out.loss, metrics)
