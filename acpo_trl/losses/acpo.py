"""ACPO: bin-wise adaptive clipping (Wang et al. 2026, "What are Key Factors for Updates in RL for LLM
Reasoning?", arXiv 2606.22570).

Tokens are put in K equal-width bins by their CURRENT probability; each bin's clip range grows with the
dispersion of the importance ratio inside it:

    r      = exp(clamp(log pi_theta - log pi_old, -20, 20))
    b      = min(floor(K p_theta), K - 1)
    std_b  = sqrt(Var_b[r] + 1e-8)                  population variance over the valid tokens of bin b
    eps_b  = clamp(base + alpha std_b, eps_min, eps_max)
    l      = max(-A r, -A clamp(r, 1 - eps_b, 1 + eps_b));   if A < 0: l = min(l, -c A)

eps_b carries no gradient. Right after a rollout r == 1, so eps_b == base: ACPO differs from a fixed clip
only from the second optimizer update of a rollout on.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .common import clip_fraction_metrics, clipped_surrogate, importance_ratio
from .registry import Metric, PolicyLossInputs, PolicyLossOutput, register_policy_loss

STD_EPS = 1e-8


class BinStats(NamedTuple):
    """Per-bin statistics of ``acpo_clip_range``, each of shape ``(num_bins,)``.

    ``count``: valid tokens in the bin (summed over processes with global statistics); ``mean``: mean ratio;
    ``std``: sqrt(population variance + 1e-8), 0 for an empty bin; ``eps``: the bin's clip range (an empty bin
    reports ``clamp(base, eps_min, eps_max)``).
    """

    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    eps: torch.Tensor


def probability_bins(logps: torch.Tensor, num_bins: int) -> torch.Tensor:
    """b = min(floor(K exp(logp)), K - 1): the index of each token's equal-width probability bin on [0, 1]."""
    return torch.clamp((logps.detach().exp() * num_bins).floor().long(), 0, num_bins - 1)


@torch.no_grad()
def acpo_clip_range(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_bins: int = 5,
    alpha: float = 3.0,
    base: float = 0.2,
    eps_min: float = 0.0,
    eps_max: float = 3.0,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, BinStats]:
    """ACPO's per-token clip range and the per-bin statistics behind it.

    Args:
        logps: ``(B, T)`` current log-probabilities of the sampled tokens (bins use the CURRENT probability).
        old_logps: ``(B, T)`` rollout-policy log-probabilities.
        mask: ``(B, T)`` 1 for tokens that enter the statistics; padding and prompt tokens never enter a bin.
        num_bins, alpha, base, eps_min, eps_max: K, alpha, base and the clamp of
            ``eps_b = clamp(base + alpha * std_b, eps_min, eps_max)``. The defaults are the paper's run.
        all_reduce: optional function summing a tensor over processes. With it, count, sum and sum of squares
            per bin are reduced first, so every process gets the ranges of the whole (global) batch.

    Returns:
        ``(eps, stats)``: ``eps`` has the shape of ``logps`` (each token's bin range, detached) and ``stats`` is a
        :class:`BinStats`. Vectorised: K bins in a few ``bincount`` calls, no host-device sync.
    """
    bins = probability_bins(logps, num_bins)
    # Accumulate in float64 around 1 (r - 1 is ~1e-4 right after a rollout) so E[x^2] - E[x]^2 does not cancel.
    acc_dtype = torch.float32 if logps.device.type == "mps" else torch.float64
    weight = mask.to(acc_dtype).flatten()
    shifted = (importance_ratio(logps, old_logps).to(acc_dtype) - 1).flatten() * weight
    flat_bins = bins.flatten()
    sums = torch.stack(
        [
            torch.bincount(flat_bins, weights=weight, minlength=num_bins),
            torch.bincount(flat_bins, weights=shifted, minlength=num_bins),
            torch.bincount(flat_bins, weights=shifted * shifted, minlength=num_bins),
        ]
    )
    if all_reduce is not None:
        sums = all_reduce(sums)
    count, sum_x, sum_x2 = sums
    n = count.clamp(min=1)
    mean_x = sum_x / n
    var = (sum_x2 / n - mean_x * mean_x).clamp(min=0)
    nonempty = count > 0
    std = torch.where(nonempty, torch.sqrt(var + STD_EPS), torch.zeros_like(var))
    eps = torch.clamp(base + alpha * std, eps_min, eps_max)
    stats = BinStats(count=count, mean=torch.where(nonempty, 1 + mean_x, torch.ones_like(mean_x)), std=std, eps=eps)
    return eps.to(logps.dtype)[bins], stats


def per_bin_metrics(
    bins: torch.Tensor,
    stats: BinStats,
    ratio: torch.Tensor,
    eps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    prefix: str = "acpo",
) -> dict[str, Metric]:
    """Per bin b: eps, std, token fraction, mean ratio, and the clip fraction of its positive-advantage
    (r > 1 + eps_b) and negative-advantage (r < 1 - eps_b) tokens."""
    num_bins = stats.count.numel()
    with torch.no_grad():
        advantages = advantages.expand_as(mask)
        flat_bins = bins.flatten()

        def per_bin(values: torch.Tensor) -> torch.Tensor:
            return torch.bincount(flat_bins, weights=(values * mask).flatten().double(), minlength=num_bins)

        local_count = per_bin(torch.ones_like(mask))
        pos, neg = (advantages > 0).float(), (advantages < 0).float()
        clipped_pos = per_bin(pos * (ratio > 1 + eps).float())
        clipped_neg = per_bin(neg * (ratio < 1 - eps).float())
        num_pos, num_neg = per_bin(pos), per_bin(neg)
        ratio_sum = per_bin(ratio)
        total = local_count.sum()
        one = torch.ones((), dtype=torch.float64, device=mask.device)
        metrics: dict[str, Metric] = {}
        for b in range(num_bins):
            key = f"{prefix}/bin{b}"
            metrics[f"{key}/eps"] = (stats.eps[b], one)
            metrics[f"{key}/std"] = (stats.std[b], one)
            metrics[f"{key}/token_frac"] = (local_count[b], total)
            metrics[f"{key}/ratio_mean"] = (ratio_sum[b], local_count[b])
            metrics[f"{key}/clip_frac_pos"] = (clipped_pos[b], num_pos[b])
            metrics[f"{key}/clip_frac_neg"] = (clipped_neg[b], num_neg[b])
        return metrics


@register_policy_loss("acpo")
def acpo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """ACPO: the clipped surrogate with each token's range eps_b from :func:`acpo_clip_range`, and dual-clip.

    ``config.acpo_stats_scope == "global"`` reduces the bin statistics over processes; "local" (the authors')
    uses the micro-batch on this process only.
    """
    all_reduce = inputs.all_reduce if config.acpo_stats_scope == "global" else None
    eps, stats = acpo_clip_range(
        inputs.logps,
        inputs.old_logps,
        inputs.mask,
        num_bins=config.acpo_num_bins,
        alpha=config.acpo_alpha,
        base=config.acpo_base_clip,
        eps_min=config.acpo_clip_min,
        eps_max=config.acpo_clip_max,
        all_reduce=all_reduce,
    )
    ratio = importance_ratio(inputs.logps, inputs.old_logps)
    loss = clipped_surrogate(ratio, inputs.advantages, eps, eps, config.dual_clip_c)
    metrics = clip_fraction_metrics(ratio, inputs.advantages, inputs.mask, 1 - eps, 1 + eps)
    bins = probability_bins(inputs.logps, config.acpo_num_bins)
    metrics.update(per_bin_metrics(bins, stats, ratio.detach(), eps, inputs.advantages, inputs.mask))
    return PolicyLossOutput(loss, metrics)
