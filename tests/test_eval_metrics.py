"""Pure metrics and the report table: pass@k against the closed form, avg@k, summaries, macro average."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from acpo_trl.evaluation.metrics import avg_at_k, macro_average, mean_pass_at_k, pass_at_k, summarize
from acpo_trl.evaluation.report import markdown_table


def _problem(scores, num_tokens=10, truncated=False):
    return [{"score": s, "num_tokens": num_tokens, "truncated": truncated} for s in scores]


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),
        (10, 10, 5, 1.0),
        (10, 3, 1, 0.3),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (8, 2, 8, 1.0),
        (8, 1, 7, 7 / 8),  # 1 - C(7,7)/C(8,7)
        (32, 4, 8, 1 - math.comb(28, 8) / math.comb(32, 8)),
    ],
)
def test_pass_at_k_known_counts(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_closed_form(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_is_the_probability_over_subsets():
    # Enumerate all k-subsets of n samples with c correct: the estimator is the exact success probability.
    n, c, k = 6, 2, 3
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k needs"):
        pass_at_k(n, c, k)


def test_avg_and_pass_at_k_over_problems():
    problems = [_problem([1, 0, 0, 0]), _problem([1, 1, 1, 1]), _problem([0, 0, 0, 0])]
    assert avg_at_k(problems) == pytest.approx((0.25 + 1 + 0) / 3)
    assert mean_pass_at_k(problems, 1) == pytest.approx(avg_at_k(problems))
    assert mean_pass_at_k(problems, 2) == pytest.approx((0.5 + 1 + 0) / 3)
    assert mean_pass_at_k(problems, 4) == pytest.approx(2 / 3)


def test_partial_credit_is_not_correct_but_counts_in_mean_score():
    problems = [_problem([0.1, 1.0])]
    metrics = summarize(problems)
    assert metrics["avg@2"] == pytest.approx(0.5)
    assert metrics["mean_score"] == pytest.approx(0.55)


def test_summarize_lengths_truncation_and_pass_ks():
    problems = [
        [{"score": 1.0, "num_tokens": 4, "truncated": False}, {"score": 0.0, "num_tokens": 8, "truncated": True}],
        [{"score": 0.0, "num_tokens": 6, "truncated": True}, {"score": 0.0, "num_tokens": 2, "truncated": False}],
    ]
    metrics = summarize(problems, pass_ks=[1, 2])
    assert metrics == {
        "avg@2": 0.25,
        "pass@1": 0.25,
        "pass@2": 0.5,
        "mean_score": 0.25,
        "mean_length": 5.0,
        "truncation_rate": 0.5,
        "num_problems": 2,
        "k": 2,
    }


def test_summarize_rejects_uneven_or_empty_problems():
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([_problem([1, 0]), _problem([1])])
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_macro_average_and_table():
    results = {
        "a": summarize([_problem([1, 0])]),
        "b": summarize([_problem([1, 1]), _problem([0, 0])]),
    }
    macro = macro_average(results)
    assert macro["avg@2"] == pytest.approx((0.5 + 0.5) / 2)
    assert macro["pass@2"] == pytest.approx((1.0 + 0.5) / 2)
    assert "num_problems" not in macro
    table = markdown_table(results)
    lines = table.strip().splitlines()
    assert lines[0].startswith("| benchmark | avg@2 (%) | pass@2 (%)")
    assert lines[2].startswith("| a | 50.00 | 100.00 |")
    assert lines[-1].startswith("| macro avg | 50.00 | 75.00 |")
    assert len(lines) == 5


def test_metrics_and_report_import_without_torch():
    code = "import sys, acpo_trl.evaluation.metrics, acpo_trl.evaluation.report; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
