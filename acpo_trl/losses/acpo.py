"""ACPO: bin-wise adaptive clipping (Wang et al. 2026, "What are Key Factors for Updates in RL for LLM
Reasoning?", arXiv 2606.22570); ``acpo_log``, this package's variant whose lower clip cannot vanish; and
``bin_clip``, a frozen bin-wise clip (a fixed range per bin, no adaptation) that separates ACPO's bins from its
adaptation.

Tokens are put in K equal-width bins by their CURRENT probability; each bin's clip range grows with the
dispersion of the importance ratio inside it (:class:`BinClipRule`):

    r      = exp(clamp(log pi_theta - log pi_old, -20, 20))
    b      = min(floor(K p_theta), K - 1)
    std_b  = sqrt(Var_b[r] + 1e-8)                  population variance over the valid tokens of bin b
    eps_b  = clamp(base + alpha std_b, eps_min, eps_max)        base = TRL's epsilon (0.2)
    acpo:     l = max(-A r, -A clamp(r, 1 - eps_b, 1 + eps_b));          if A < 0: l = min(l, -c A)

The range is symmetric, as the paper's: ``epsilon_high`` must be unset or equal to ``epsilon`` (an asymmetric base
has no meaning in the rule, so it is refused). eps_b carries no gradient. Right after a rollout r == 1, so eps_b == base: ACPO differs from a fixed clip
only from the second optimizer update of a rollout on. Once std_b passes (1 - base) / alpha the lower bound
1 - eps_b is below 0 and the low clip vanishes (only the dual-clip bounds A < 0 tokens).

``acpo_log`` (not in the paper) measures dispersion and clips on the log scale, so that the range stays
two-sided at any dispersion:

    std_b  = sqrt(Var_b[log r] + 1e-8)
    acpo_log: l = max(-A r, -A exp(clamp(log r, -eps_b, eps_b)));        if A < 0: l = min(l, -c A)

i.e. r is clipped to [e^-eps_b, e^eps_b]. For small dispersion log r ~ r - 1, so both rules agree near on-policy.

``bin_clip`` (not in the paper) is the same surrogate with eps_b = bin_clip_ranges[b], given in the config: the
rule with alpha = 0 and a base per bin. Set to ACPO's measured mean ranges it asks whether ACPO helps by its
widths per bin or by following the ratio's spread (docs/RESULTS.md, "Why ACPO wins").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from .common import LOG_RATIO_CLAMP, clip_ratio_metrics, clipped_surrogate, importance_ratio
from .registry import Metric, PolicyLossInputs, PolicyLossOutput, register_policy_loss

STD_EPS = 1e-8
STATISTICS = ("ratio", "logratio")
PAPER_BASE = 0.2  # the paper's base range: the diagnostics' ACPO rule under a method that does not clip by bins
# The ACPOConfig field behind each BinClipRule field (for error messages that name what the user sets).
_CONFIG_FIELDS = {
    "num_bins": "acpo_num_bins",
    "alpha": "acpo_alpha",
    "base": "epsilon",
    "eps_min": "acpo_clip_min",
    "eps_max": "acpo_clip_max",
}


class BinStats(NamedTuple):
    """Per-bin statistics of a :class:`BinClipRule`, each of shape ``(num_bins,)``, float64.

    ``count``: valid tokens in the bin (summed over processes with global statistics); ``mean``: mean of the rule's
    statistic (the ratio for ``acpo``, the log-ratio for ``acpo_log``); ``std``: sqrt(population variance + 1e-8),
    0 for an empty bin; ``eps``: the bin's clip range (an empty bin reports ``clamp(base, eps_min, eps_max)``).
    """

    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    eps: torch.Tensor


class InvalidRule(ValueError):
    """A :class:`BinClipRule` field out of range (``field``, ``value``, ``message``: what is wrong and the fix)."""

    def __init__(self, field: str, value, message: str):
        super().__init__(f"BinClipRule.{field}={value!r}: {message}")
        self.field, self.value, self.message = field, value, message


def probability_bins(logps: torch.Tensor, num_bins: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """b = min(floor(K exp(logp)), K - 1): each token's equal-width probability bin on [0, 1] (int64).

    With ``mask``, masked-out tokens get the extra index K, so per-bin sums over K + 1 slots exclude them."""
    # floor(min(K p, K - 1/2)) == min(floor(K p), K - 1); the masking (K for masked-out tokens) is done in float
    # arithmetic, K + (x - K) * mask, which is several times cheaper than masked_fill on int64.
    scaled = (logps.detach().exp() * num_bins).clamp_(max=num_bins - 0.5)
    if mask is not None:
        scaled = scaled.sub_(num_bins).mul_(mask).add_(num_bins)
    return scaled.long()


@dataclass(frozen=True)
class BinClipRule:
    """ACPO's bin rule: K bins of the current probability, eps_b = clamp(base + alpha std_b, eps_min, eps_max),
    std_b the within-bin std of ``statistic`` (``"ratio"``: r, ACPO; ``"logratio"``: log r, ``acpo_log``).

    Built once per configuration with :meth:`from_config` and shared by the losses, the diagnostics and
    :func:`acpo_clip_range`. The defaults are the paper's run."""

    num_bins: int = 5
    alpha: float = 3.0
    base: float | tuple[float, ...] = 0.2  # one for every bin, or one per bin (``bin_clip``'s frozen ranges)
    eps_min: float = 0.0
    eps_max: float = 3.0
    statistic: str = "ratio"

    def __post_init__(self):
        if not isinstance(self.num_bins, int) or isinstance(self.num_bins, bool) or self.num_bins < 1:
            raise InvalidRule("num_bins", self.num_bins, "must be an integer >= 1 (the paper uses 5).")
        if isinstance(self.base, tuple) and len(self.base) != self.num_bins:
            raise InvalidRule("base", self.base, f"one range per bin: {self.num_bins} values, or one number.")
        for name, paper in (("alpha", 3.0), ("base", 0.2), ("eps_min", 0.0)):
            values = getattr(self, name) if isinstance(getattr(self, name), tuple) else (getattr(self, name),)
            if not all(math.isfinite(v) and v >= 0 for v in values):
                raise InvalidRule(name, getattr(self, name), f"must be finite and >= 0 (the paper uses {paper}).")
        if math.isnan(self.eps_max) or self.eps_max < self.eps_min:
            raise InvalidRule("eps_max", self.eps_max, f"must be >= the lower clamp {self.eps_min} (the paper uses 3.0).")
        if self.statistic not in STATISTICS:
            raise InvalidRule("statistic", self.statistic, f"must be one of {STATISTICS}.")

    @classmethod
    def from_config(cls, config, statistic: str = "ratio", base: float | None = None) -> "BinClipRule":
        """The rule of an :class:`~acpo_trl.ACPOConfig` (fields ``acpo_num_bins``, ``acpo_alpha``, ``epsilon`` (the
        base, unless ``base`` is given), ``acpo_clip_min``, ``acpo_clip_max``); an invalid value raises naming the
        config field. Cached per distinct values, so a loss can call it every micro-batch."""
        values = {key: getattr(config, name) for key, name in _CONFIG_FIELDS.items()}
        if base is not None:
            values["base"] = base
        return _rule_from_values(tuple(values.values()), statistic)

    def bins(self, logps: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`probability_bins` with this rule's K."""
        return probability_bins(logps, self.num_bins, mask)

    def deviation(self, logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
        """The statistic minus its value on-policy, float32: r - 1 or log r (both 0 when nothing moved, so float32
        sums stay accurate)."""
        log_ratio = torch.clamp(logps.detach() - old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).float()
        return log_ratio.exp() - 1 if self.statistic == "ratio" else log_ratio

    @torch.no_grad()
    def stats(
        self,
        bins: torch.Tensor,
        x: torch.Tensor,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> BinStats:
        """Per-bin count, mean, std and eps from ``bins`` (from :meth:`bins` with the mask: masked-out tokens in slot
        K) and ``x`` (from :meth:`deviation`).

        Two passes, so that float32 sums are accurate: count and sum of x per bin give the mean, then the sum of
        squared deviations from it gives the population variance. With ``all_reduce`` both passes are summed over
        processes (two reductions of K numbers each)."""
        k = self.num_bins
        flat_bins = bins.reshape(-1)
        x = x.reshape(-1).float()
        zeros = x.new_zeros(k + 1)
        first = torch.stack([zeros.scatter_add(0, flat_bins, torch.ones_like(x)), zeros.scatter_add(0, flat_bins, x)])
        first = first[:, :k] if all_reduce is None else all_reduce(first[:, :k])
        count, sum_x = first.double()
        n = count.clamp(min=1)
        mean_x = sum_x / n
        deviation = x - torch.cat([mean_x, mean_x.new_zeros(1)]).float().index_select(0, flat_bins)
        sum_sq = zeros.scatter_add(0, flat_bins, deviation * deviation)[:k]
        sum_sq = (sum_sq if all_reduce is None else all_reduce(sum_sq)).double()
        nonempty = count > 0
        std = torch.where(nonempty, torch.sqrt(sum_sq / n + STD_EPS), torch.zeros_like(sum_sq))
        base = std.new_tensor(self.base) if isinstance(self.base, tuple) else self.base
        eps = torch.clamp(base + self.alpha * std, self.eps_min, self.eps_max)
        offset = 1.0 if self.statistic == "ratio" else 0.0
        mean = torch.where(nonempty, offset + mean_x, torch.full_like(mean_x, offset))
        return BinStats(count=count, mean=mean, std=std, eps=eps)

    @staticmethod
    def token_eps(stats: BinStats, bins: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Each token's eps_b (masked-out tokens, in slot K, get 0)."""
        per_slot = torch.cat([stats.eps, stats.eps.new_zeros(1)]).to(dtype)
        return per_slot.index_select(0, bins.reshape(-1)).view_as(bins)

    def ratio_bounds(self, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high) of the clipped ratio: [1 - eps, 1 + eps] for ``ratio``, [e^-eps, e^eps] for ``logratio``."""
        return (1 - eps, 1 + eps) if self.statistic == "ratio" else (torch.exp(-eps), torch.exp(eps))

    @torch.no_grad()
    def clip_range(
        self,
        logps: torch.Tensor,
        old_logps: torch.Tensor,
        mask: torch.Tensor,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, BinStats]:
        """(bins, per-token eps, per-bin stats) of a micro-batch; ``eps`` has the dtype of ``logps``."""
        bins = self.bins(logps, mask)
        stats = self.stats(bins, self.deviation(logps, old_logps), all_reduce)
        return bins, self.token_eps(stats, bins, logps.dtype), stats


@functools.lru_cache(maxsize=64)
def _rule_from_values(values: tuple, statistic: str) -> BinClipRule:
    try:
        return BinClipRule(*values, statistic=statistic)
    except InvalidRule as error:
        field = _CONFIG_FIELDS.get(error.field, error.field)
        raise ValueError(f"ACPOConfig.{field}={error.value!r}: {error.message}") from None


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
    """ACPO's per-token clip range and the per-bin statistics behind it (:class:`BinClipRule` on the ratio).

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
    rule = BinClipRule(num_bins=num_bins, alpha=alpha, base=base, eps_min=eps_min, eps_max=eps_max)
    _, eps, stats = rule.clip_range(logps, old_logps, mask, all_reduce)
    return eps, stats


# Token classes for the per-bin metrics: (advantage sign) x (clipped or not).
_POS, _POS_CLIPPED, _NEG, _NEG_CLIPPED, _ZERO = range(5)
_NUM_CLASSES = 5


@torch.no_grad()
def per_bin_metrics(
    rule: BinClipRule,
    bins: torch.Tensor,
    stats: BinStats,
    clipped_high: torch.Tensor,
    clipped_low: torch.Tensor,
    advantages: torch.Tensor,
    prefix: str = "acpo",
) -> dict[str, Metric]:
    """TRL's clip-ratio metrics, and per bin b: eps, std, mean of the rule's statistic (``ratio_mean`` or
    ``logratio_mean``), token fraction, and the clip fraction of its positive-advantage (above the range) and
    negative-advantage (below it) tokens.

    ``bins`` from :meth:`BinClipRule.bins` with the mask; ``clipped_high`` / ``clipped_low`` from
    :func:`clipped_surrogate`. One ``scatter_add`` over (bin, token class) codes gives every count at once."""
    num_bins = rule.num_bins
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
    # eps, std and the mean are averaged over the processes (and micro-batches) where the bin holds tokens.
    nonempty = (stats.count > 0).double()
    metrics.update({
        f"{prefix}/bin{{}}/eps": (stats.eps * nonempty, nonempty),
        f"{prefix}/bin{{}}/std": (stats.std * nonempty, nonempty),
        f"{prefix}/bin{{}}/{rule.statistic}_mean": (stats.mean * nonempty, nonempty),
        f"{prefix}/bin{{}}/token_frac": (count, total.expand_as(count)),
        f"{prefix}/bin{{}}/clip_frac_pos": (pos_clipped, num_pos),
        f"{prefix}/bin{{}}/clip_frac_neg": (neg_clipped, num_neg),
    })
    return metrics


def bin_clipped_loss(inputs: PolicyLossInputs, config, rule: BinClipRule) -> PolicyLossOutput:
    """The clipped surrogate with each token's range from ``rule`` (ratio bounds of :meth:`BinClipRule.ratio_bounds`),
    dual-clip and TRL's ``delta``. ``config.acpo_stats_scope == "global"`` reduces the bin statistics over processes; "local" (the
    authors') uses the micro-batch on this process only."""
    ratio = importance_ratio(inputs.logps, inputs.old_logps)
    all_reduce = inputs.all_reduce if config.acpo_stats_scope == "global" else None
    bins, eps, stats = rule.clip_range(inputs.logps, inputs.old_logps, inputs.mask, all_reduce)
    low, high = rule.ratio_bounds(eps)
    out = clipped_surrogate(ratio, inputs.advantages, low, high, config.dual_clip_c, ratio_max=config.delta)
    metrics = per_bin_metrics(rule, bins, stats, out.clipped_high, out.clipped_low, inputs.advantages)
    return PolicyLossOutput(out.loss, metrics, out.clipped_high, out.clipped_low)


def validate_acpo(config) -> None:
    """The bin rule's fields (through :meth:`BinClipRule.from_config`), a symmetric base and the statistics scope."""
    BinClipRule.from_config(config)
    if config.epsilon_high is not None and config.epsilon_high != config.epsilon:
        raise ValueError(f"ACPOConfig.epsilon_high={config.epsilon_high!r}: ACPO's range per bin, eps_b = epsilon + "
                         "alpha std_b, is symmetric (the paper's rule has no high side of its own); leave "
                         f"epsilon_high unset or equal to epsilon ({config.epsilon}).")
    if config.acpo_stats_scope not in ("local", "global"):
        raise ValueError(f"ACPOConfig.acpo_stats_scope={config.acpo_stats_scope!r}: must be 'local' (per "
                         "micro-batch, as the authors) or 'global'.")


# The fields of ACPO's rule: the base (TRL's epsilon; epsilon_high only checked), K, alpha, the clamp, the scope.
ACPO_FIELDS = ("epsilon", "epsilon_high", "acpo_num_bins", "acpo_alpha", "acpo_clip_min", "acpo_clip_max",
               "acpo_stats_scope", "dual_clip_c", "delta")


@register_policy_loss("acpo", validate=validate_acpo, bin_rule=BinClipRule.from_config, reads=ACPO_FIELDS,
                      summary="clip range per bin of the current probability, eps_b = epsilon + alpha std_b (the "
                              "within-bin std of r), clamped; dual clip",
                      source="Wang et al. 2026 (2606.22570)")
def acpo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """ACPO: the clipped surrogate with ratio range [1 - eps_b, 1 + eps_b], eps_b from the within-bin std of r."""
    return bin_clipped_loss(inputs, config, BinClipRule.from_config(config))


@register_policy_loss("acpo_log", validate=validate_acpo, reads=ACPO_FIELDS,
                      bin_rule=functools.partial(BinClipRule.from_config, statistic="logratio"),
                      summary="**this package's variant, not the paper's**: ACPO's bins, eps_b from the within-bin "
                              "std of log r, log r clipped to [-eps_b, eps_b], so the lower clip never vanishes",
                      source="this package")
def acpo_log_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """This package's variant (not the paper's): log r clipped to [-eps_b, eps_b], eps_b from the within-bin std of
    log r, with ACPO's config fields (K, alpha, base, clamp, dual-clip, scope)."""
    return bin_clipped_loss(inputs, config, BinClipRule.from_config(config, statistic="logratio"))


def frozen_rule(config) -> BinClipRule:
    """``bin_clip``'s rule: K = len(bin_clip_ranges) bins, eps_b = bin_clip_ranges[b] (alpha 0, a base per bin)."""
    ranges = config.bin_clip_ranges
    if not ranges:
        raise ValueError(f"ACPOConfig.bin_clip_ranges={ranges!r}: policy_loss='bin_clip' needs one clip range per "
                         "probability bin, e.g. [0.43, 0.28, 0.27, 0.27, 0.23] for 5 bins.")
    try:
        ranges = tuple(float(v) for v in ranges)
        return _frozen_rule(ranges)
    except (InvalidRule, TypeError, ValueError) as error:
        raise ValueError(f"ACPOConfig.bin_clip_ranges={config.bin_clip_ranges!r}: each range must be a finite number "
                         ">= 0 (one per probability bin).") from error


@functools.lru_cache(maxsize=16)
def _frozen_rule(ranges: tuple[float, ...]) -> BinClipRule:
    return BinClipRule(num_bins=len(ranges), alpha=0.0, base=ranges, eps_min=0.0, eps_max=max(ranges))


@register_policy_loss("bin_clip", validate=frozen_rule, bin_rule=frozen_rule,
                      reads=("bin_clip_ranges", "dual_clip_c", "delta"),
                      summary="**this package's ablation**: ACPO's bins with a fixed range per bin (`bin_clip_ranges`, "
                              "K = its length): bin-wise widths without adaptation",
                      source="this package")
def bin_clip_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """A frozen bin-wise clip: ratio range [1 - eps_b, 1 + eps_b], eps_b = bin_clip_ranges[b] for the bin of the
    token's CURRENT probability (ACPO's bins, no adaptation); dual-clip and ``delta`` as ACPO."""
    return bin_clipped_loss(inputs, config, frozen_rule(config))
