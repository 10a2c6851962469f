"""``high_entropy`` / ``low_entropy``: the policy gradient on part of each sequence's tokens, chosen by the
current policy's entropy (Wang et al. 2025, "Beyond the 80/20 Rule", as the ACPO authors ran it).

In EACH sequence, the k = max(1, int(entropy_token_fraction * n_valid)) highest-entropy tokens are "high";
``high_entropy`` trains on them only (top 20% by default), ``low_entropy`` on the other n_valid - k (the
bottom 80%). TRL's ``top_entropy_quantile`` is a batch-wide threshold: a different method. The objective on
the kept tokens is the fixed clip ``ppo_clip`` (epsilon / epsilon_high, dual-clip); dropped tokens keep their
place in the denominator.
"""

from __future__ import annotations

import torch

from .ppo import ppo_clip_loss
from .registry import PolicyLossInputs, PolicyLossOutput, register_policy_loss


@torch.no_grad()
def top_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, fraction: float) -> torch.Tensor:
    """Boolean ``(B, T)``: the k = max(1, int(fraction * n_valid)) highest-entropy valid tokens of each row
    (ties broken by position; rows with no valid token select nothing)."""
    valid = mask.bool()
    num_valid = valid.sum(-1, keepdim=True)
    k = torch.clamp((fraction * num_valid).long(), min=1)
    order = entropies.float().masked_fill(~valid, float("-inf")).argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.size(-1), device=order.device).expand_as(order))
    return (rank < k) & valid


def _entropy_selected_loss(inputs: PolicyLossInputs, config, keep_high: bool) -> PolicyLossOutput:
    if inputs.entropies is None:
        raise ValueError("high_entropy / low_entropy need the per-token entropies (PolicyLossInputs.entropies).")
    high = top_entropy_mask(inputs.entropies, inputs.mask, config.entropy_token_fraction)
    selected = high if keep_high else ~high & inputs.mask.bool()
    out = ppo_clip_loss(inputs, config)
    metrics = dict(out.metrics)
    metrics["entropy/selected_frac"] = ((selected * inputs.mask).sum(), inputs.mask.sum())
    return PolicyLossOutput(out.per_token_loss * selected, metrics)


@register_policy_loss("high_entropy")
def high_entropy_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """The fixed clip on the top ``entropy_token_fraction`` (20%) highest-entropy tokens of each sequence."""
    return _entropy_selected_loss(inputs, config, keep_high=True)


@register_policy_loss("low_entropy")
def low_entropy_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """The fixed clip on each sequence's tokens outside its top ``entropy_token_fraction`` (the bottom 80%)."""
    return _entropy_selected_loss(inputs, config, keep_high=False)
