"""Per update index and per probability bin statistics of the importance ratio, for any policy loss.

Pure functions of one micro-batch's tensors (no trainer state). Tokens are binned, and the clip range ACPO would
give each bin is computed, by the run's :class:`~acpo_trl.losses.BinClipRule` (not re-implemented), so runs of
every method are compared on the same footing.

Per bin b the metrics are (name -> (numerator, denominator), the trainer's format):

    token_frac             share of the micro-batch's valid tokens in the bin
    ratio_mean/ratio_std   mean and population std of r = exp(clamp(log pi - log pi_old, -20, 20))
    logratio_mean/_std     the same for x = log r
    logratio_skew          E[(x - mu)^3] / sigma^3 of x within the bin (0 for a log-normal r)
    logratio_kurt          excess kurtosis E[(x - mu)^4] / sigma^4 - 3 (0 for a log-normal r)
    acpo_eps               eps_b = clamp(base + alpha std_b, min, max) of ``rule`` (std of r, or of log r for
                           ``acpo_log``'s rule)
    acpo_clip_frac_pos/neg fraction of the bin's A > 0 (A < 0) tokens that ACPO's eps_b would clip
    clip_frac_pos/neg      the same for the clip masks the method actually run returned (when it has any)
    moved_frac             share of the bin's tokens with A != 0 whose ratio moved more than ``MOVED_BAND`` (0.2)
                           from 1: outside GRPO's clip [0.8, 1.2], which these clips contain: ACPO's 0.2 + alpha
                           std, DAPO's [0.8, 1.3], CISPO's mask and weight cap, the dual clip at 3, any fixed range
                           of at least 0.2 (not ``acpo_log``'s [e^-eps, e^eps]). A run whose every update logs 0 in
                           every bin was clipped by none of them, so any of them would have made the same updates
                           (its loss is the unclipped one).

Moments and std are computed per micro-batch (ACPO's "local" scope) and averaged over the micro-batches and
processes where the bin holds tokens (as ``per_bin_metrics`` does for eps); skew and kurtosis need at least
``MIN_TOKENS_FOR_SHAPE`` tokens in a bin and a log-ratio std above ``MIN_STD_FOR_SHAPE`` (float32 round-off, e.g.
at k = 0), otherwise that micro-batch does not contribute. Cost: a handful of
``scatter_add`` over the (B, T) tokens, no host sync (measured in ``benchmarks/diagnostics_overhead.py``).
"""

from __future__ import annotations

import torch

from ..losses.acpo import BinClipRule
from ..losses.common import LOG_RATIO_CLAMP
from ..losses.registry import Metric

MIN_TOKENS_FOR_SHAPE = 8
MOVED_BAND = 0.2  # moved_frac: |r - 1| beyond GRPO's clip range
MIN_STD_FOR_SHAPE = 1e-4  # below it the log-ratio is float32 round-off (as ACPO's std floor sqrt(1e-8))
_VAR_EPS = 1e-12


def _key(prefix: str, k: int | None, b: int, name: str) -> str:
    return f"{prefix}/bin{b}/{name}" if k is None else f"{prefix}/k{k}/bin{b}/{name}"


@torch.no_grad()
def ratio_diagnostics(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    rule: BinClipRule = BinClipRule(),
    clipped_high: torch.Tensor | None = None,
    clipped_low: torch.Tensor | None = None,
    k: int | None = None,
    prefix: str = "diag",
) -> dict[str, Metric]:
    """The per-bin metrics listed in the module docstring for one micro-batch.

    Args:
        logps, old_logps, mask: ``(B, T)``; ``logps`` may carry a gradient (it is detached here).
        advantages: ``(B, 1)`` or ``(B, T)``.
        rule: ACPO's bin rule (``BinClipRule.from_config`` of the run; the paper's by default), applied with this
            micro-batch's statistics (ACPO's "local" scope).
        clipped_high, clipped_low: the method's clip masks (``(B, T)`` bool: A > 0 tokens clipped above,
            A < 0 tokens clipped below), as its loss returned them; None logs no ``clip_frac_*``.
        k: the update index within the rollout; metric names are ``{prefix}/k{k}/bin{b}/...`` (or
            ``{prefix}/bin{b}/...`` without it).
    """
    logps = logps.detach()
    mask = mask.detach()
    bins = rule.bins(logps, mask)
    per_bin = _BinSums(bins, rule.num_bins)
    x = torch.clamp(logps - old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).double()
    moments = _moments(per_bin, x)
    stats = rule.stats(bins, rule.deviation(logps, old_logps))
    columns = _clip_columns(per_bin, rule, stats, bins, x.exp(), advantages.expand_as(logps), mask.bool(),
                            clipped_high, clipped_low)
    count = moments["count"]
    total = count.sum()
    nonempty = (count > 0).double()
    shaped = ((count >= MIN_TOKENS_FOR_SHAPE) & (moments["logratio_std"] > MIN_STD_FOR_SHAPE)).double()
    metrics: dict[str, Metric] = {}
    for b in range(rule.num_bins):
        e, s = nonempty[b], shaped[b]
        metrics[_key(prefix, k, b, "token_frac")] = (count[b], total)
        for name in ("ratio_mean", "ratio_std", "logratio_mean", "logratio_std"):
            metrics[_key(prefix, k, b, name)] = (moments[name][b] * e, e)
        for name in ("logratio_skew", "logratio_kurt"):
            metrics[_key(prefix, k, b, name)] = (moments[name][b] * s, s)
        metrics[_key(prefix, k, b, "acpo_eps")] = (stats.eps[b] * e, e)
        for name, (num, den) in columns.items():
            metrics[_key(prefix, k, b, name)] = (num[b], den[b])
    return metrics


class _BinSums:
    """Sums per probability bin of a token-level tensor (``bins`` from :meth:`BinClipRule.bins` with the mask:
    masked-out tokens in slot K, dropped), float64."""

    def __init__(self, bins: torch.Tensor, num_bins: int):
        self.flat_bins, self.num_bins = bins.reshape(-1), num_bins

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        values = values.reshape(-1).double()
        return values.new_zeros(self.num_bins + 1).scatter_add(0, self.flat_bins, values)[: self.num_bins]

    def spread(self, per_bin: torch.Tensor) -> torch.Tensor:
        """A per-bin value back on each token (0 in the masked-out slot)."""
        return torch.cat([per_bin, per_bin.new_zeros(1)]).index_select(0, self.flat_bins)


def _moments(per_bin: _BinSums, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per bin: the token count, mean and population std of r = e^x and of x = log r, and x's skew and excess
    kurtosis (two passes: the means, then the moments about them)."""
    x = x.reshape(-1)
    ratio = x.exp()
    count = per_bin(torch.ones_like(x))
    n = count.clamp(min=1)
    mean_x, mean_r = per_bin(x) / n, per_bin(ratio) / n
    dev = x - per_bin.spread(mean_x)
    m2, m3, m4 = per_bin(dev**2) / n, per_bin(dev**3) / n, per_bin(dev**4) / n
    std_r = torch.sqrt(per_bin((ratio - per_bin.spread(mean_r)) ** 2) / n)
    return {"count": count, "ratio_mean": mean_r, "ratio_std": std_r, "logratio_mean": mean_x,
            "logratio_std": torch.sqrt(m2), "logratio_skew": m3 / (m2 + _VAR_EPS) ** 1.5,
            "logratio_kurt": m4 / (m2 + _VAR_EPS) ** 2 - 3}


def _clip_columns(per_bin: _BinSums, rule: BinClipRule, stats, bins: torch.Tensor, ratio: torch.Tensor,
                  adv: torch.Tensor, valid: torch.Tensor, clipped_high, clipped_low) -> dict[str, Metric]:
    """Per bin, (numerator, denominator) of the clip fractions ACPO's ranges would give, the moved fraction, and the
    method's own clip fractions when it returned its masks."""
    pos, neg = (adv > 0) & valid, (adv < 0) & valid
    low, high = rule.ratio_bounds(rule.token_eps(stats, bins, torch.float64))
    num_pos, num_neg = per_bin(pos), per_bin(neg)
    columns = {
        "acpo_clip_frac_pos": (per_bin((ratio > high) & pos), num_pos),
        "acpo_clip_frac_neg": (per_bin((ratio < low) & neg), num_neg),
        "moved_frac": (per_bin(((ratio - 1).abs() > MOVED_BAND) & (pos | neg)), num_pos + num_neg),
    }
    if clipped_high is not None and clipped_low is not None:
        columns["clip_frac_pos"] = (per_bin(clipped_high & pos), num_pos)
        columns["clip_frac_neg"] = (per_bin(clipped_low & neg), num_neg)
    return columns
