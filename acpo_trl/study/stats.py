"""The statistics the study's report shares between its sections (``table.py``, ``drift.py``, ``mechanism.py``): per
group and variant the summary of the finished runs (:func:`summarize`), seed-paired differences and drops with their
95% intervals, and means over a diagnostic's update indices and bins."""

from __future__ import annotations

import math
import random
from collections import defaultdict

from .results import group_of


def mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, sd


def summarize(results: list[dict], exclude_collapsed: bool = False) -> dict:
    """{task: {"uprs": [...], "rows": {variant: {...}}}} with per-regime statistics, drops, ranks, collapses."""
    cells: dict = defaultdict(list)
    for r in results:
        cells[(group_of(r), r["variant"], r["spec"]["upr"])].append(r)
    tasks = sorted({t for t, _, _ in cells})
    summary = {}
    ranks: dict = defaultdict(list)
    for task in tasks:
        uprs = sorted({u for t, _, u in cells if t == task})
        variants = sorted({v for t, v, _ in cells if t == task})
        rows = {}
        for variant in variants:
            row = {"regimes": {}}
            for upr in uprs:
                runs = cells.get((task, variant, upr), [])
                kept = [r for r in runs if not (exclude_collapsed and r["collapsed"])]
                final = mean_sd([r["final_sampled"] for r in kept])
                last = mean_sd([r["last_evals_mean"] for r in kept])
                row["regimes"][upr] = {
                    "n": len(kept), "final": final, "last": last,
                    "by_seed": {r["spec"]["seed"]: r["final_sampled"] for r in kept},
                    "collapsed": sum(r["collapsed"] for r in runs), "runs": len(runs),
                    "below_start": sum(r["final_sampled"] < r["start_sampled"] and not r["collapsed"] for r in runs),
                    "start": mean_sd([r["start_sampled"] for r in runs])[0],
                    "angle": mean_sd([r["mean_angle_deg"] for r in runs if r.get("mean_angle_deg") is not None])[0],
                }
            near = row["regimes"][uprs[0]]["by_seed"] if uprs else {}
            row["drop"] = {u: paired_drop(near, row["regimes"][u]["by_seed"]) for u in uprs[1:]}
            row["drop_ci"] = {u: drop_interval(near, row["regimes"][u]["by_seed"]) for u in uprs[1:]}
            rows[variant] = row
        for upr in uprs:
            finals = {v: rows[v]["regimes"][upr]["final"][0] for v in variants if rows[v]["regimes"][upr]["n"] > 0}
            for v, rank in mid_ranks(finals).items():
                ranks[(task, v)].append(rank)
        summary[task] = {"uprs": uprs, "rows": rows}
    for task, data in summary.items():
        for v, row in data["rows"].items():
            values = ranks.get((task, v), [])
            row["avg_rank"] = sum(values) / len(values) if values else math.nan
            row["ranks"] = values
    return summary


def mid_ranks(scores: dict[str, float]) -> dict[str, float]:
    """Rank 1 for the highest score; tied scores share the mean of the ranks they span (two variants tied for first
    are 1.5 each), so that variants with the same outcome (``Identical runs``) are not ordered by name."""
    ordered = sorted(scores.values(), reverse=True)
    first = {}
    for position, score in enumerate(ordered, 1):
        first.setdefault(score, position)
    return {v: first[s] + (ordered.count(s) - 1) / 2 for v, s in scores.items()}


def relative_drop(near: list[float], far: list[float]) -> float:
    a = sum(near) / len(near)
    return (a - sum(far) / len(far)) / a if a > 0 else math.nan


def paired_drop(near: dict[int, float], far: dict[int, float]) -> float:
    """The relative drop (mean(near) - mean(far)) / mean(near) of the final accuracy, over the seeds both regimes
    ran (``{seed: final}``): a seed's runs start from the same model and see the same prompts, so the two regimes
    are compared seed by seed."""
    seeds = sorted(near.keys() & far.keys())
    return relative_drop([near[s] for s in seeds], [far[s] for s in seeds]) if seeds else math.nan


def paired_interval(a: dict[int, float], b: dict[int, float], statistic, resamples: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of ``statistic(a_values, b_values)`` over the seeds both dicts hold: the
    seeds are resampled with replacement, each drawn seed bringing its pair of runs (a fixed bootstrap seed)."""
    seeds = sorted(a.keys() & b.keys())
    if len(seeds) < 2:
        return math.nan, math.nan
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        drawn = rng.choices(seeds, k=len(seeds))
        value = statistic([a[s] for s in drawn], [b[s] for s in drawn])
        if math.isfinite(value):
            values.append(value)
    values.sort()
    if not values:
        return math.nan, math.nan
    return values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]


def drop_interval(near: dict[int, float], far: dict[int, float], resamples: int = 2000,
                  seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of :func:`paired_drop`: the seeds both regimes ran are resampled with
    replacement, each drawn seed bringing its pair of runs (deterministic: a fixed bootstrap seed)."""
    return paired_interval(near, far, relative_drop, resamples, seed)


def mean_difference(a: list[float], b: list[float]) -> float:
    return sum(x - y for x, y in zip(a, b)) / len(a)


def difference_interval(a: dict[int, float], b: dict[int, float], resamples: int = 2000,
                        seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the mean difference a - b of the final accuracy of two variants in one regime,
    paired by seed (a seed's runs of every variant start from the same model and see the same prompts)."""
    return paired_interval(a, b, mean_difference, resamples, seed)


def shown(x: float, spec: str, unit: str = "") -> str:
    """``x`` formatted with the format ``spec`` and followed by ``unit``, or "–" where it is no number: the tables'
    nan means "no seeds" or "an SD of one seed"."""
    return format(x, spec) + unit if math.isfinite(x) else "–"


def mean(values) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def bin_mean(runs: list[dict], metric: str, b: int, reduce=mean) -> float:
    """``reduce`` (the mean) of a per-(k, bin) diagnostic over ``runs``, bin ``b``, update indices k >= 1."""
    return reduce([v for r in runs for kb, v in r["diagnostics"]["bins"].get(metric, {}).items()
                   if kb.endswith(f",{b}") and int(kb.split(",")[0]) >= 1])


def clip_metric(runs: list[dict], sign: str) -> str:
    """The diagnostic of the method's own clip fraction for advantages of ``sign`` ("pos" / "neg"); runs logged
    before the diagnostics had it recorded ACPO's rule's only."""
    own = any(f"clip_frac_{sign}" in r["diagnostics"]["bins"] for r in runs)
    return f"clip_frac_{sign}" if own else f"acpo_clip_frac_{sign}"


# Student's t quantile 0.975 (a two-sided 95% interval) by degrees of freedom; past 30, 1.96 + 2.39 / df (within
# 0.1% of the exact value at 40, 60 and 120).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    return T_975[df - 1] if df <= len(T_975) else 1.96 + 2.39 / df


def t_interval(a: dict[int, float], b: dict[int, float]) -> tuple[float, float]:
    """95% paired t interval of the mean difference a - b over the seeds both hold: mean(d) +- t_{0.975, n-1} sd(d) /
    sqrt(n). At a handful of seeds the percentile bootstrap is too narrow (it draws from the n differences only and
    ignores that their sd is itself estimated); the t interval accounts for that, under normal differences."""
    diffs = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
    if len(diffs) < 2:
        return math.nan, math.nan
    center, sd = mean_sd(diffs)
    half = t_quantile_975(len(diffs) - 1) * sd / math.sqrt(len(diffs))
    return center - half, center + half
