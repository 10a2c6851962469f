"""Fixed-epsilon objectives in TRL's clip vocabulary (``epsilon`` the low side, ``epsilon_high`` the high side):
``ppo_clip`` (TRL's GRPO clip, and GSPO with ``importance_sampling_level="sequence"``), ``dapo`` (clip-higher), and
``unclipped``, the importance-weighted policy gradient with no trust region (the study's control)."""

from __future__ import annotations

import torch

from .common import clip_ratio_metrics, clipped_surrogate, policy_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, epsilon_high, register_policy_loss

# The fields of every fixed clip below: TRL's range, its ratio cap and ratio level, and this package's dual clip.
FIXED_CLIP_FIELDS = ("epsilon", "epsilon_high", "delta", "dual_clip_c")
DAPO_EPSILON_HIGH = 0.28  # the DAPO paper's clip-higher, when epsilon_high is unset


def fixed_clip_loss(
    inputs: PolicyLossInputs,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
    ratio_max: float | None = None,
    level: str = "token",
) -> PolicyLossOutput:
    """l = max(-A r', -A clamp(r, 1 - eps_low, 1 + eps_high)), dual-clipped at -c A for A < 0 when c is set;
    r' = min(r, ratio_max) when TRL's ``delta`` is set; r per token or per sequence (``level``, broadcast over the
    sequence's tokens)."""
    mask = inputs.mask
    ratio = policy_ratio(inputs.logps, inputs.old_logps, mask, level)
    out = clipped_surrogate(ratio, inputs.advantages, 1 - eps_low, 1 + eps_high, dual_clip_c, ratio_max=ratio_max)
    clipped_high, clipped_low = out.clipped_high.expand(mask.shape), out.clipped_low.expand(mask.shape)
    metrics = clip_ratio_metrics((clipped_low * mask).sum(), (clipped_high * mask).sum(), mask.sum())
    return PolicyLossOutput(out.loss.expand(mask.shape), metrics, clipped_high, clipped_low)


@register_policy_loss("ppo_clip", reads=(*FIXED_CLIP_FIELDS, "importance_sampling_level"),
                      summary="GRPO/PPO fixed clip [1 - epsilon, 1 + epsilon_high], exactly TRL's, with the dual clip; "
                              "GSPO's sequence-level ratio with `importance_sampling_level: sequence`",
                      source="Shao et al. 2024 (2402.03300); GSPO: Zheng et al. 2025 (2507.18071)")
def ppo_clip_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """TRL's GRPO clip: range [1 - epsilon, 1 + epsilon_high] (epsilon_high defaults to epsilon), TRL's ``delta``
    cap and ``importance_sampling_level`` included, plus dual-clip when ``dual_clip_c`` is set. With
    ``dual_clip_c=None`` this is TRL's per-token loss for ``loss_type`` in {grpo, bnpo, dr_grpo, dapo, luspo}, and
    GSPO's with ``importance_sampling_level="sequence"``."""
    return fixed_clip_loss(inputs, config.epsilon, epsilon_high(config, "ppo_clip"), config.dual_clip_c,
                           ratio_max=config.delta, level=config.importance_sampling_level)


@register_policy_loss("dapo", reads=(*FIXED_CLIP_FIELDS, "importance_sampling_level"),
                      unset={"epsilon_high": DAPO_EPSILON_HIGH},
                      summary="clip-higher: TRL's fixed clip with the DAPO paper's `epsilon_high` when it is unset "
                              "(the ACPO authors ran 0.3: a recipe value)",
                      source="Yu et al. 2025 (2503.14476)")
def dapo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """DAPO's clip-higher (Yu et al. 2025) alone: ``ppo_clip`` with ``epsilon_high`` 0.28 when unset, dual-clip.

    The DAPO paper's recipe is 0.2 / 0.28 with ``loss_type="dapo"`` (token-mean), plus dynamic sampling and overlong
    shaping (not here); the run's own aggregation applies.
    """
    return fixed_clip_loss(inputs, config.epsilon, epsilon_high(config, "dapo"), config.dual_clip_c,
                           ratio_max=config.delta, level=config.importance_sampling_level)


@register_policy_loss("unclipped", reads=("importance_sampling_level",),
                      summary="the importance-weighted policy gradient l = -A r: no clip, no dual clip, no cap "
                              "(the control for \"does clipping matter here\")",
                      source="this package (the PPO surrogate without its clip)")
def unclipped_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """l = -A r, r per token (or per sequence with ``importance_sampling_level="sequence"``): the surrogate whose
    gradient is the off-policy policy gradient A r grad log pi, with no trust region. Its clip masks are empty."""
    mask = inputs.mask
    ratio = policy_ratio(inputs.logps, inputs.old_logps, mask, config.importance_sampling_level)
    loss = (-inputs.advantages * ratio).expand(mask.shape)
    none = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
    zero = mask.new_zeros(())
    return PolicyLossOutput(loss, clip_ratio_metrics(zero, zero, mask.sum()), none, none)
