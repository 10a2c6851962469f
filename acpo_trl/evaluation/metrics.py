"""Accuracy metrics of sampled evaluation: avg@k, unbiased pass@k, length and truncation summaries.

Pure Python (no torch, no TRL), so analysis tools can reuse them. A *problem* is a list of sample dicts with at
least ``score`` (the reward), and for the length summaries ``num_tokens`` and ``truncated``. A sample counts as
correct when its score reaches ``threshold`` (1.0: full credit; the project's rewards are binary, so then avg@k is
also the mean score).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# The key of the per-problem correct counts beside an evaluation's metrics (a list per benchmark, not a logged metric).
CORRECT = "correct_per_problem"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al., 2021): ``1 - C(n-c, k) / C(n, k)``.

    The probability that at least one of ``k`` samples drawn without replacement from ``n`` samples, ``c`` of them
    correct, is correct.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}.")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n (k samples out of n), got n={n}, k={k}.")
    if n - c < k:
        return 1.0
    # Product form of C(n-c, k) / C(n, k): exact enough and no huge integers.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def num_correct(problem: Sequence[Mapping], threshold: float = 1.0) -> int:
    """Number of samples of one problem whose ``score`` reaches ``threshold``."""
    return sum(sample["score"] >= threshold for sample in problem)


def avg_at_k(problems: Sequence[Sequence[Mapping]], threshold: float = 1.0) -> float:
    """Mean over problems of the fraction of correct samples (with ``k`` samples each: avg@k)."""
    _check_nonempty(problems)
    return sum(num_correct(p, threshold) / len(p) for p in problems) / len(problems)


def mean_pass_at_k(problems: Sequence[Sequence[Mapping]], k: int, threshold: float = 1.0) -> float:
    """Mean over problems of [`pass_at_k`] with each problem's own sample and correct counts."""
    _check_nonempty(problems)
    return sum(pass_at_k(len(p), num_correct(p, threshold), k) for p in problems) / len(problems)


def summarize(problems: Sequence[Sequence[Mapping]], pass_ks: Sequence[int] = (), threshold: float = 1.0) -> dict:
    """Metrics of one benchmark: ``avg@k``, ``pass@j`` for each ``j`` in ``pass_ks`` (default: ``k``), ``mean_score``,
    ``mean_length`` (completion tokens), ``truncation_rate`` (fraction of samples cut by the token limit),
    ``num_problems`` and ``k`` (samples per problem, which must be the same for every problem)."""
    _check_nonempty(problems)
    sizes = {len(p) for p in problems}
    if len(sizes) != 1:
        raise ValueError(f"Every problem needs the same number of samples to report avg@k; got sizes {sorted(sizes)}.")
    (k,) = sizes
    samples = [s for p in problems for s in p]
    metrics = {f"avg@{k}": avg_at_k(problems, threshold)}
    for j in pass_ks or (k,):
        metrics[f"pass@{j}"] = mean_pass_at_k(problems, j, threshold)
    metrics["mean_score"] = sum(s["score"] for s in samples) / len(samples)
    metrics["mean_length"] = sum(s["num_tokens"] for s in samples) / len(samples)
    metrics["truncation_rate"] = sum(bool(s["truncated"]) for s in samples) / len(samples)
    metrics["num_problems"] = len(problems)
    metrics["k"] = k
    return metrics


def macro_average(results: Mapping[str, Mapping[str, float]]) -> dict:
    """Unweighted mean over benchmarks of every metric that all of them report (as the papers' "Avg." column);
    ``num_problems`` and ``k`` are counts, not averaged."""
    if not results:
        raise ValueError("macro_average needs at least one benchmark's metrics.")
    first = next(iter(results.values()))
    shared = [key for key in first if key not in ("num_problems", "k") and all(key in m for m in results.values())]
    return {key: sum(m[key] for m in results.values()) / len(results) for key in shared}


def _check_nonempty(problems: Sequence) -> None:
    if not problems or any(len(p) == 0 for p in problems):
        raise ValueError("Metrics need at least one problem and at least one sample per problem.")
