"""``high_entropy`` / ``low_entropy``: the policy gradient on part of each sequence's tokens, chosen by the
current policy's entropy (Wang et al. 2025, "Beyond the 80/20 Rule", as the ACPO authors ran it).

In EACH sequence with n valid tokens, ``high_entropy`` trains on the k = max(1, int(f n)) highest-entropy tokens
(f = ``entropy_token_fraction``, 0.2) and ``low_entropy`` on the k = max(1, int((1 - f) n)) lowest-entropy ones
(the bottom 80%), as the authors' code counts them. TRL's ``top_entropy_quantile`` is a batch-wide threshold: a
different method. The objective on the kept tokens is DAPO's clipped surrogate, [1 - epsilon, 1 + epsilon_high]
with 0.28 when ``epsilon_high`` is unset (the paper trains on DAPO's recipe; the ACPO authors' launcher runs every
PPO-style baseline with 0.3: a recipe value), and dual-clip; dropped tokens keep their place in the denominator.
"""

from __future__ import annotations

import torch

from .ppo import DAPO_EPSILON_HIGH, FIXED_CLIP_FIELDS, fixed_clip_loss
from .registry import PolicyLossInputs, PolicyLossOutput, epsilon_high, register_policy_loss

ENTROPY_FIELDS = (*FIXED_CLIP_FIELDS, "entropy_token_fraction")
SOURCE = "Wang et al. 2025 (2506.01939)"


@torch.no_grad()
def entropy_rank_mask(entropies: torch.Tensor, mask: torch.Tensor, fraction: float, highest: bool = True) -> torch.Tensor:
    """Boolean ``(B, T)``: the k = max(1, int(fraction * n_valid)) highest-entropy (``highest``) or lowest-entropy
    valid tokens of each row (ties broken by position; rows with no valid token select nothing)."""
    valid = mask.bool()
    num_valid = valid.sum(-1, keepdim=True)
    k = torch.clamp((fraction * num_valid).long(), min=1)
    key = entropies.float() if highest else -entropies.float()
    order = key.masked_fill(~valid, float("-inf")).argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.size(-1), device=order.device).expand_as(order))
    return (rank < k) & valid


def validate_entropy(config) -> None:
    if not 0 < config.entropy_token_fraction < 1:
        raise ValueError(f"ACPOConfig.entropy_token_fraction={config.entropy_token_fraction!r}: must be in (0, 1) "
                         "(the paper uses 0.2).")


def _entropy_selected_loss(inputs: PolicyLossInputs, config, highest: bool) -> PolicyLossOutput:
    # 1 - f rounded, so that f = 0.2 gives exactly the authors' 0.8 (1 - 0.2 is 0.7999999999999999 in binary)
    fraction = config.entropy_token_fraction if highest else round(1 - config.entropy_token_fraction, 12)
    selected = entropy_rank_mask(inputs.entropies, inputs.mask, fraction, highest)
    high = epsilon_high(config, "high_entropy" if highest else "low_entropy")
    out = fixed_clip_loss(inputs, config.epsilon, high, config.dual_clip_c, config.delta)
    metrics = dict(out.metrics)
    metrics["entropy/selected_frac"] = ((selected * inputs.mask).sum(), inputs.mask.sum())
    return PolicyLossOutput(out.per_token_loss * selected, metrics, out.clipped_high, out.clipped_low)


@register_policy_loss("high_entropy", needs={"entropies"}, validate=validate_entropy, reads=ENTROPY_FIELDS,
                      unset={"epsilon_high": DAPO_EPSILON_HIGH}, source=SOURCE,
                      summary="DAPO's clip on each sequence's k = max(1, int(f n)) highest-entropy tokens "
                              "(f = `entropy_token_fraction`; per sequence, not TRL's batch quantile)")
def high_entropy_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """The clipped surrogate on the top ``entropy_token_fraction`` (20%) highest-entropy tokens of each sequence."""
    return _entropy_selected_loss(inputs, config, highest=True)


@register_policy_loss("low_entropy", needs={"entropies"}, validate=validate_entropy, reads=ENTROPY_FIELDS,
                      unset={"epsilon_high": DAPO_EPSILON_HIGH}, source=SOURCE,
                      summary="DAPO's clip on each sequence's k = max(1, int((1 - f) n)) lowest-entropy tokens, as "
                              "the authors count them")
def low_entropy_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """The clipped surrogate on the bottom 1 - ``entropy_token_fraction`` (80%) lowest-entropy tokens of each
    sequence."""
    return _entropy_selected_loss(inputs, config, highest=False)
