"""Advantage reweightings (Huang et al. 2026, "On the Direction of RLVR Updates", arXiv 2603.22117, Eq. 8,
and the two reweightings it compares), composed with a clipped objective.

A reweighting scales each token's advantage, A~_t = w_t A_t (both signs), and hands A~ to the objective named by
``reweight_base_loss`` (default ``dapo``; any registered loss that is not itself a reweighting). p_old is the
rollout policy's probability of the token; when old log-probs are not computed (on-policy) the trainer passes
the detached current ones, as the paper's code does.

    dlogp_reweight   w_t = 1 + c (1 - p_old(y_t))        c = 0.2 (Qwen2.5-Math-7B), 0.1 (Qwen3-8B)
    dominate         w_t = c p_old(y_t) + 1 - c          (down-weights rare tokens; AR's form)
    ppl              w_i = 1 - c z_i, z_i the z-score within the prompt's group of
                     logPPL_i = -mean_t log p_old(y_t), broadcast to the sequence; optionally clamped to [0.8, 1.2]

The paper's full recipe is the DAPO loss with token-mean aggregation (``loss_type="dapo"``), clip 0.2 / 0.28 (the
``dapo`` default) and dual-clip c = 10, plus dynamic sampling and overlong shaping (not here).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .registry import POLICY_LOSSES, PolicyLossInputs, PolicyLossOutput, get_policy_loss, register_policy_loss

PPL_WEIGHT_RANGE = (0.8, 1.2)


def dlogp_weights(p_old: torch.Tensor, c: float) -> torch.Tensor:
    """Eq. 8 of the Δlog p paper: w = 1 + c (1 - p_old), up-weighting low-probability tokens."""
    return 1 + c * (1 - p_old)


def dominate_weights(p_old: torch.Tensor, c: float) -> torch.Tensor:
    """w = c p_old + 1 - c: down-weights low-probability tokens (AR's advantage reweighting)."""
    return c * p_old + 1 - c


def ppl_weights(logppl_z: torch.Tensor, c: float, clamp: bool) -> torch.Tensor:
    """w_i = 1 - c z_i per sequence, ``(B, 1)``; clamped to [0.8, 1.2] when ``clamp``."""
    weights = (1 - c * logppl_z).unsqueeze(-1)
    return weights.clamp(*PPL_WEIGHT_RANGE) if clamp else weights


def validate_reweighting(config) -> None:
    """The base objective is a one-pass method that does not itself feed another (``reweight_c`` >= 0 is checked
    with every float field of the config)."""
    base = POLICY_LOSSES.get(config.reweight_base_loss)
    if base is None or base.wraps is not None or base.passes_per_rollout != 1:
        allowed = sorted(name for name, entry in POLICY_LOSSES.items()
                         if entry.wraps is None and entry.passes_per_rollout == 1)
        raise ValueError(f"ACPOConfig.reweight_base_loss={config.reweight_base_loss!r}: must be one of {allowed}.")


def reweighted_loss(inputs: PolicyLossInputs, config, weights: torch.Tensor) -> PolicyLossOutput:
    """The ``reweight_base_loss`` objective on advantages ``weights * A``; logs the mean weight. The weights are
    positive, so the advantage signs, and with them the base objective's clip masks, are kept."""
    weights = weights.detach()
    base = get_policy_loss(config.reweight_base_loss)
    out = base(replace(inputs, advantages=weights * inputs.advantages), config)
    mask = inputs.mask
    metrics = dict(out.metrics)
    metrics["reweight/mean_weight"] = ((weights.expand_as(mask) * mask).sum(), mask.sum())
    return PolicyLossOutput(out.per_token_loss, metrics, out.clipped_high, out.clipped_low)


def register_reweighting(name: str, summary: str, source: str, needs=(), reads=()):
    """Register a reweighting: it feeds ``reweight_base_loss`` and is validated with it (and reads its fields)."""
    return register_policy_loss(name, needs=needs, validate=validate_reweighting, wraps="reweight_base_loss",
                                reads=("reweight_c", "reweight_base_loss", *reads), summary=summary, source=source)


SOURCE = "Huang et al. 2026 (2603.22117)"


@register_reweighting("dlogp_reweight", source=f"{SOURCE}, Eq. 8",
                      summary="advantage x (1 + c (1 - p_old)), then `reweight_base_loss`")
def dlogp_reweight_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """A~ = (1 + c (1 - p_old)) A, then ``reweight_base_loss``."""
    return reweighted_loss(inputs, config, dlogp_weights(inputs.old_logps.exp(), config.reweight_c))


@register_reweighting("dominate", source=f"{SOURCE} (a compared reweighting)",
                      summary="advantage x (c p_old + 1 - c), then `reweight_base_loss`")
def dominate_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """A~ = (c p_old + 1 - c) A, then ``reweight_base_loss``."""
    return reweighted_loss(inputs, config, dominate_weights(inputs.old_logps.exp(), config.reweight_c))


@register_reweighting("ppl", needs={"logppl_z"}, reads=("ppl_clamp",), source=f"{SOURCE} (a compared reweighting)",
                      summary="sequence weight 1 - c z, z the in-group z-score of log-perplexity under pi_old, then "
                              "`reweight_base_loss`")
def ppl_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """A~_i = (1 - c z_i) A_i with z_i the in-group z-score of the sequence's log-perplexity."""
    if inputs.logppl_z is None:
        raise ValueError(
            "policy_loss='ppl' needs PolicyLossInputs.logppl_z (per-sequence z-scored log-perplexity within the "
            "prompt group); ACPOTrainer computes it at rollout time."
        )
    return reweighted_loss(inputs, config, ppl_weights(inputs.logppl_z, config.reweight_c, config.ppl_clamp))
