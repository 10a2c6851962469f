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

from .common import clip_ratio_metrics, clipped_surrogate, importance_ratio
from .registry import Metric, PolicyLossInputs, PolicyLossOutput, register_policy_loss

STD_EPS = 1e-8


class BinStats(NamedTuple):
    """Per-bin statistics of ``acpo_clip_range``, each of shape ``(num_bins,)``, float64.

    ``count``: valid tokens in the bin (summed over processes with global statistics); ``mean``: mean ratio;
    ``std``: sqrt(population variance + 1e-8), 0 for an empty bin; ``eps``: the bin's clip range (an empty bin
    reports ``clamp(base, eps_min, eps_max)``).
    """

    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    eps: torch.Tensor


def probability_bins(logps: torch.Tensor, num_bins: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """b = min(floor(K exp(logp)), K - 1): each token's equal-width probability bin on [0, 1] (int64).

    With ``mask``, masked-out tokens get the extra index K, so per-bin sums over K + 1 slots exclude them."""
    # floor(min(K p, K - 1/2)) == min(floor(K p), K - 1); the masking (K for masked-out tokens) is done in float
    # arithmetic, K + (x - K) * mask, which is several times cheaper than masked_fill on int64.
    scaled = (logps.detach().exp() * num_bins).clamp_(max=num_bins - 0.5)
    if mask is not None:
        scaled = scaled.sub_(num_bins).mul_(mask).add_(num_bins)
    return scaled.long()


@torch.no_grad()
def bin_clip_range(
    bins: torch.Tensor,
    ratio: torch.Tensor,
    *,
    num_bins: int,
    alpha: float,
    base: float,
    eps_min: float,
    eps_max: float,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> BinStats:
    """Per-bin count, mean, std and eps (see :func:`acpo_clip_range`) from ``bins`` as returned by
    ``probability_bins(logps, K, mask)`` (masked-out tokens in slot K) and the detached ratios.

    Two passes, so that float32 sums are accurate: count and sum of x = r - 1 per bin give the mean, then the
    sum of squared deviations from it gives the population variance. With ``all_reduce`` both passes are
    summed over processes (two reductions of K numbers each)."""
    flat_bins = bins.reshape(-1)
    x = ratio.reshape(-1).float() - 1
    zeros = x.new_zeros(num_bins + 1)
    first = torch.stack([zeros.scatter_add(0, flat_bins, torch.ones_like(x)), zeros.scatter_add(0, flat_bins, x)])
    first = first[:, :num_bins] if all_reduce is None else all_reduce(first[:, :num_bins])
    count, sum_x = first.double()
    n = count.clamp(min=1)
    mean_x = sum_x / n
    deviation = x - torch.cat([mean_x, mean_x.new_zeros(1)]).float().index_select(0, flat_bins)
    sum_sq = zeros.scatter_add(0, flat_bins, deviation * deviation)[:num_bins]
    sum_sq = (sum_sq if all_reduce is None else all_reduce(sum_sq)).double()
    nonempty = count > 0
    std = torch.where(nonempty, torch.sqrt(sum_sq / n + STD_EPS), torch.zeros_like(sum_sq))
    eps = torch.clamp(base + alpha * std, eps_min, eps_max)
    return BinStats(count=count, mean=torch.where(nonempty, 1 + mean_x, torch.ones_like(mean_x)), std=std, eps=eps)


def token_clip_range(stats: BinStats, bins: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each token's eps_b (masked-out tokens, in slot K, get the base range of an empty bin)."""
    per_slot = torch.cat([stats.eps, stats.eps.new_zeros(1)]).to(dtype)
    return per_slot.index_select(0, bins.reshape(-1)).view_as(bins)


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
        ``(eps, stats)``: ``eps`` has the shape of ``logps`` (each valid token's bin range, detached; masked-out
        tokens get 0) and ``stats`` is a :class:`BinStats`. Vectorised over bins (``scatter_add``), no host-device
        sync.
    """
    with torch.no_grad():
        bins = probability_bins(logps, num_bins, mask)
        stats = bin_clip_range(
            bins, importance_ratio(logps.detach(), old_logps), num_bins=num_bins, alpha=alpha, base=base,
            eps_min=eps_min, eps_max=eps_max, all_reduce=all_reduce,
        )
        return token_clip_range(stats, bins, logps.dtype), stats


# Token classes for the per-bin metrics: (advantage sign) x (clipped or not).
_POS, _POS_CLIPPED, _NEG, _NEG_CLIPPED, _ZERO = range(5)
_NUM_CLASSES = 5


@torch.no_grad()
def per_bin_metrics(
    bins: torch.Tensor,
    stats: BinStats,
    clipped_high: torch.Tensor,
    clipped_low: torch.Tensor,
    advantages: torch.Tensor,
    prefix: str = "acpo",
) -> dict[str, Metric]:
    """TRL's clip-ratio metrics, and per bin b: eps, std, mean ratio, token fraction, and the clip fraction of
    its positive-advantage (r > 1 + eps_b) and negative-advantage (r < 1 - eps_b) tokens.

    ``bins`` as returned by ``probability_bins(logps, K, mask)``; ``clipped_high`` / ``clipped_low`` from
    :func:`clipped_surrogate`. One ``scatter_add`` over
    (bin, token class) codes gives every count at once."""
    num_bins = stats.count.numel()
    # Sign classes are computed at the advantages' own shape ((B, 1) for sequence advantages), then broadcast.
    sign_class = torch.where(advantages > 0, _POS, torch.where(advantages < 0, _NEG, _ZERO))
    # clipped_high / clipped_low already carry the advantage sign, so at most one is set per token.
    code = torch.add(sign_class, bins, alpha=_NUM_CLASSES).add_(clipped_high | clipped_low)
    flat_code = code.reshape(-1)
    counts = torch.zeros((num_bins + 1) * _NUM_CLASSES, dtype=torch.float64, device=code.device)
    counts = counts.scatter_add_(0, flat_code, counts.new_ones(1).expand_as(flat_code))
    counts = counts[: num_bins * _NUM_CLASSES].view(num_bins, _NUM_CLASSES)
    pos_clipped, neg_clipped = counts[:, _POS_CLIPPED], counts[:, _NEG_CLIPPED]
    num_pos, num_neg = counts[:, _POS] + pos_clipped, counts[:, _NEG] + neg_clipped
    count = num_pos + num_neg + counts[:, _ZERO]
    total = count.sum()
    metrics = clip_ratio_metrics(neg_clipped.sum(), pos_clipped.sum(), total)
    # eps, std and the mean ratio are averaged over the processes (and micro-batches) where the bin holds tokens.
    nonempty = (stats.count > 0).double()
    metrics.update({
        f"{prefix}/bin{{}}/eps": (stats.eps * nonempty, nonempty),
        f"{prefix}/bin{{}}/std": (stats.std * nonempty, nonempty),
        f"{prefix}/bin{{}}/ratio_mean": (stats.mean * nonempty, nonempty),
        f"{prefix}/bin{{}}/token_frac": (count, total.expand_as(count)),
        f"{prefix}/bin{{}}/clip_frac_pos": (pos_clipped, num_pos),
        f"{prefix}/bin{{}}/clip_frac_neg": (neg_clipped, num_neg),
    })
    return metrics


@register_policy_loss("acpo")
def acpo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """ACPO: the clipped surrogate with each token's range eps_b from :func:`acpo_clip_range`, and dual-clip.

    ``config.acpo_stats_scope == "global"`` reduces the bin statistics over processes; "local" (the authors')
    uses the micro-batch on this process only.
    """
    ratio = importance_ratio(inputs.logps, inputs.old_logps)
    bins = probability_bins(inputs.logps, config.acpo_num_bins, inputs.mask)
    stats = bin_clip_range(
        bins,
        ratio.detach(),
        num_bins=config.acpo_num_bins,
        alpha=config.acpo_alpha,
        base=config.acpo_base_clip,
        eps_min=config.acpo_clip_min,
        eps_max=config.acpo_clip_max,
        all_reduce=inputs.all_reduce if config.acpo_stats_scope == "global" else None,
    )
    eps = token_clip_range(stats, bins, ratio.dtype)
    out = clipped_surrogate(ratio, inputs.advantages, 1 - eps, 1 + eps, config.dual_clip_c)
    metrics = per_bin_metrics(bins, stats, out.clipped_high, out.clipped_low, inputs.advantages)
    return PolicyLossOutput(out.loss, metrics)
