"""``ar_lopti``: Advantage Reweighting + Low-Probability Token Isolation (Yang et al. 2025, "Do Not Let
Low-Probability Tokens Over-Dominate in RL for LLMs"), as the ACPO authors ran it.

    A~_t = (ar_weight_c p_old + 1 - ar_weight_c) A_t            c = 0.3: A~ = (0.3 p_old + 0.7) A
    pass 0 over the rollout: only tokens with p_old <  lopti_prob_threshold (0.5) enter the loss
    pass 1 over the rollout: only tokens with p_old >= lopti_prob_threshold
    objective: fixed clip [1 - epsilon, 1 + epsilon_high] (0.2 / 0.24: epsilon_high 0.24 when unset), dual-clip

Both passes are full update passes against the same old log-probs, so the second sees the first's movement.
The entry declares two passes per rollout (TRL's ``num_iterations = 2``, which ACPOConfig sets) and needs the
update pass index. Twice the optimizer steps per rollout.
"""

from __future__ import annotations

from dataclasses import replace

from .ppo import FIXED_CLIP_FIELDS, fixed_clip_loss
from .registry import PolicyLossInputs, PolicyLossOutput, epsilon_high, register_policy_loss
from .reweight import dominate_weights

LOPTI_EPSILON_HIGH = 0.24  # the ACPO authors' AR-Lopti runs, when epsilon_high is unset


def validate_ar_lopti(config) -> None:
    if not 0 < config.lopti_prob_threshold < 1:
        raise ValueError(f"ACPOConfig.lopti_prob_threshold={config.lopti_prob_threshold!r}: must be in (0, 1) (the "
                         "paper uses 0.5).")


@register_policy_loss("ar_lopti", needs={"update_pass"}, passes_per_rollout=2, validate=validate_ar_lopti,
                      reads=(*FIXED_CLIP_FIELDS, "ar_weight_c", "lopti_prob_threshold"),
                      unset={"epsilon_high": LOPTI_EPSILON_HIGH},
                      summary="advantage x (c p_old + 1 - c); two update passes per rollout, low-probability tokens "
                              "(p_old < `lopti_prob_threshold`) first; sets `num_iterations: 2`",
                      source="Yang et al. 2025 (2505.12929)")
def ar_lopti_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """See the module docstring."""
    p_old = inputs.old_logps.exp()
    weights = dominate_weights(p_old, config.ar_weight_c).detach()
    low_prob = p_old < config.lopti_prob_threshold
    selected = low_prob if inputs.update_pass == 0 else ~low_prob
    out = fixed_clip_loss(
        replace(inputs, advantages=weights * inputs.advantages),
        config.epsilon,
        epsilon_high(config, "ar_lopti"),
        config.dual_clip_c,
        config.delta,
    )
    mask = inputs.mask
    num_tokens = mask.sum()
    metrics = dict(out.metrics)
    metrics["lopti/low_prob_frac"] = ((low_prob * mask).sum(), num_tokens)
    metrics["lopti/selected_frac"] = ((selected * mask).sum(), num_tokens)
    metrics["reweight/mean_weight"] = ((weights * mask).sum(), num_tokens)
    return PolicyLossOutput(out.per_token_loss * selected, metrics, out.clipped_high, out.clipped_low)
