"""MATH reward: extraction, math-verify decisions on the real fixtures, time bounds, parallel path, hostile input."""

import logging
import os
import pickle
import signal
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from math_verify import verify

from acpo_trl.data.math import BENCHMARKS, load_math_eval, load_orz
from acpo_trl.rewards.math import (
    MathReward,
    _close_pools,
    _parse,
    fast_score,
    gold_answer,
    last_boxed,
    math_reward,
    normalize_answer,
    screen_answer,
    sympy_shortcut,
    verify_answer,
)

FIXTURES = Path(__file__).parent / "fixtures" / "math"
# Real sympy hangs (minutes or more, partly inside C big-integer code) that the screen lets through: only killing
# the process stops them.
HANGS = [r"(10^{8})!", r"\binom{10^{9}}{10^{5}}", r"(1+x)^{1000}"]


def fixture_golds() -> dict[str, list[str]]:
    golds = {name: load_math_eval(name, path=FIXTURES / f"{name}.jsonl")["answer"] for name in BENCHMARKS}
    golds["orz"] = load_orz(FIXTURES / "orz.json")["answer"]
    return golds


GOLDS = fixture_golds()
ALL_GOLDS = [g for golds in GOLDS.values() for g in golds]


def child_processes() -> set[int]:
    """Ids of this process's child processes, zombies (killed but not reaped) included."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state_and_parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # it exited meanwhile
            continue
        if int(state_and_parent[1]) == os.getpid():
            children.add(int(stat.parent.name))
    return children


@pytest.fixture(scope="module", autouse=True)
def no_checker_process_left_behind():
    before = child_processes()
    yield
    assert child_processes() <= before  # every reward closed and reaped its processes, spares included


@pytest.fixture(scope="module")
def reward():
    reward = MathReward(timeout=20.0, num_workers=2)
    yield reward
    reward.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed {x^{2}}", "x^{2}"),
        (r"\fbox{7}", "7"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{a\}b}", r"a\}b"),
        (r"\boxed{\boxed{5}}", r"\boxed{5}"),
        (r"\boxed{}", ""),
        (r"\boxed{5} and then \boxed{6", None),
        (r"\boxed 5", None),
        ("no box at all", None),
        ("", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_boxed_is_linear_on_hostile_text():
    start = time.perf_counter()
    assert last_boxed("\\boxed{" * 30_000) is None
    assert last_boxed("{" * 100_000 + "\\boxed{1}" + "}" * 100_000) == "1"
    assert last_boxed("\\boxed{}" * 20_000) == ""
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("benchmark", sorted(GOLDS))
def test_every_fixture_gold_scores_one(reward, benchmark):
    golds = GOLDS[benchmark]
    completions = [f"Let me think. ... so the answer is \\boxed{{{g}}}" for g in golds]
    assert reward(prompts=None, completions=completions, answer=golds) == [1.0] * len(golds)
    conversations = [[{"role": "assistant", "content": c}] for c in completions]
    assert reward(prompts=None, completions=conversations, answer=golds) == [1.0] * len(golds)


def test_math_verify_accepts_every_fixture_gold():
    """The test above is decided by the fast string check: math-verify itself must also parse and accept each gold."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    assert [g for g in ALL_GOLDS if verify_answer(gold_answer(g), gold_answer(g)) != 1.0] == []


SHORTCUT_FORMS = [
    r"\sqrt{2}", r"\frac{\sqrt{2}}{2}", "0.707107", "0.7071", r"\pi", "3.14159", r"e^{2}", r"\ln 2", r"50\%", "0.5",
    "50", r"2^{10}", "1024", r"\sin(\pi/6)", "1/2", r"45^\circ", "i", "1+i", r"\infty", "x^2+2x+1", "(x+1)^2",
    "x(x+2)+1", "2x", "x+x", r"\frac{x}{2}", "0.5x", "ab", "a b", "n^2", r"\frac{1}{x}", "x^{-1}", r"\sqrt{x^2}", "x",
    r"\sin^2 x+\cos^2 x", "1", "e^{x}", r"\exp(x)", "x=2", "2",
]


def assert_shortcut_agrees(pairs) -> int:
    """``sympy_shortcut`` decides like full math-verify wherever it decides; returns how often it decided."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    decided = 0
    for gold, pred in pairs:
        parsed_gold, parsed_pred = _parse(gold_answer(gold)), _parse(gold_answer(pred))
        shortcut = sympy_shortcut(parsed_gold, parsed_pred)
        if shortcut is not None:
            decided += 1
            assert shortcut == float(verify(parsed_gold, parsed_pred, timeout_seconds=None)), (gold, pred)
    return decided


def test_sympy_shortcut_agrees_with_math_verify():
    n = len(SHORTCUT_FORMS)
    pairs = [(SHORTCUT_FORMS[i], SHORTCUT_FORMS[(i + k) % n]) for i in range(n) for k in (1, 2, 3, n - 1, n - 2)]
    pairs += [(g, o) for golds in GOLDS.values() for g, o in zip(golds, golds[1:] + golds[:1])]
    assert assert_shortcut_agrees(pairs) > len(pairs) // 2


def latex_polynomial(coefficients: list[int]) -> str:
    return "+".join(f"{c}x^{{{k}}}" for k, c in enumerate(coefficients)).replace("+-", "-")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-9, 9), min_size=1, max_size=4), st.lists(st.integers(-9, 9), min_size=1, max_size=3),
       st.integers(-2, 2))
def test_sympy_shortcut_on_random_polynomials(p, q, change):
    """Gold: the expanded product p*q; prediction: the factored form, sometimes with one coefficient changed."""
    product = [sum(p[i] * q[k - i] for i in range(len(p)) if 0 <= k - i < len(q)) for k in range(len(p) + len(q) - 1)]
    q = [q[0] + change, *q[1:]]
    assert_shortcut_agrees([(latex_polynomial(product), f"({latex_polynomial(p)})({latex_polynomial(q)})")])


def differs_in_value(a: str, b: str) -> bool:
    """Different answers, also when one is an assignment of the other (math-verify scores ``5`` vs ``x=5`` as equal)."""
    a, b = normalize_answer(a), normalize_answer(b)
    return a != b and a.rsplit("=", 1)[-1] != b.rsplit("=", 1)[-1]


@pytest.mark.parametrize("benchmark", sorted(GOLDS))
def test_gold_of_another_problem_scores_zero(reward, benchmark):
    golds = GOLDS[benchmark]
    others = [next(o for o in golds[i + 1 :] + golds[:i] if differs_in_value(o, g)) for i, g in enumerate(golds)]
    scores = reward(prompts=None, completions=[f"\\boxed{{{o}}}" for o in others], answer=golds)
    assert scores == [0.0] * len(golds)


# math-verify 0.9's decisions, as observed (gold, prediction inside \boxed{}, score).
EQUIVALENCES = [
    ("025", "25", 1.0),  # AIME zero padding
    ("27.0", "27", 1.0),  # AMC float
    (r"Thus $x=\boxed{1.6}$ cm", "1.6", 1.0),  # Minerva-style gold given as its solution's box
    (r"$\frac{1}{2}$", "0.5", 1.0),  # OlympiadBench gold in $...$
    (r"\frac12", r"\dfrac{1}{2}", 1.0),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})", 1.0),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi/2)", 1.0),
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", 1.0),
    (r"\frac{\sqrt{3}}{2}", "0.866025", 1.0),  # floats are rounded to 6 decimals
    (r"\frac{\sqrt{3}}{2}", "0.866", 0.0),
    (r"\frac{1}{3}", "0.333333", 1.0),
    (r"\frac{1}{3}", "0.33", 0.0),
    (r"\pi", "3.14159", 0.0),
    (r"2\sqrt{2}", r"\sqrt{8}", 1.0),
    ("x^2+2x+1", "(x+1)^2", 1.0),
    (r"6.5 \times 10^{-3}", "0.0065", 1.0),
    ("1,000", "1000", 1.0),
    (r"995\text{ dollars}", "995", 1.0),  # \text units are dropped, either side
    ("995", r"995\text{ dollars}", 1.0),
    (r"15 \, \text{cm}^2", "15", 1.0),
    (r"45^\circ", "45", 1.0),
    (r"\$5", "5", 1.0),
    (r"50\%", "50", 1.0),  # a percentage equals its number ...
    ("50", r"50\%", 1.0),
    (r"50\%", "0.5", 1.0),  # ... and its fraction
    ("n = 4", "4", 1.0),  # an assignment equals its value, either side
    ("4", "n=4", 1.0),
    ("n = 4", "x = 4", 0.0),  # but not an assignment to another variable
    (r"\text{(C)}", "C", 1.0),
    ("2, 3", "3, 2", 1.0),  # comma lists are sets
    ("2, 3", r"\{2,3\}", 1.0),
    (r"[-1, \infty)", r"[-1,\infty)", 1.0),
    (r"[-1, \infty)", r"(-1,\infty)", 0.0),
    (r"k \geqslant 2", r"k \geq 2", 1.0),
    (r"\text{east}", r"\text{East}", 1.0),
    (r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}", r"\begin{pmatrix} -\frac13 \\ \frac23 \end{pmatrix}", 1.0),
]


def test_equivalent_forms(reward):
    golds = [g for g, _, _ in EQUIVALENCES]
    completions = [f"The answer is \\boxed{{{p}}}." for _, p, _ in EQUIVALENCES]
    scores = reward(prompts=None, completions=completions, answer=golds)
    assert list(zip(golds, scores)) == [(g, s) for g, _, s in EQUIVALENCES]


def test_gold_and_completion_edge_cases(reward):
    box = r"\boxed{25}"
    completions = [box, box, box, r"\boxed{27}", None, 3, [{"role": "user", "content": box}], "no box", r"\boxed{25",
                   r"\boxed{}", [{"role": "assistant", "content": [{"type": "text", "text": box}]}]]
    golds = [None, "", "   ", 27.0, "25", "25", "25", "25", "25", "25", "025"]
    assert reward(prompts=None, completions=completions, answer=golds) == [
        None, None, None, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0
    ]


def test_missing_answer_column_is_an_error(reward):
    with pytest.raises(ValueError, match="`answer`"):
        reward(prompts=["p"], completions=[r"\boxed{1}"], solution=["1"])
    with pytest.raises(ValueError, match="2 completions but 1 `answer`"):
        reward(prompts=None, completions=["a", "b"], answer=["1"])


def test_trl_name_and_pickling():
    # TRL names a callable by getattr(func, "__name__", type(func).__name__) (trl.trainer.utils.get_callable_name)
    assert (math_reward.__name__, type(math_reward).__name__) == ("math_reward", "MathReward")
    copy = pickle.loads(pickle.dumps(MathReward(timeout=3.0, num_workers=2, parallel_threshold=7)))
    assert (copy.timeout, copy.num_workers, copy.parallel_threshold, copy.__name__) == (3.0, 2, 7, "math_reward")
    assert copy(completions=[r"\boxed{0.5}"], answer=[r"\frac{1}{2}"]) == [1.0]  # decided without a worker
    assert copy._pool is None


def slow_pairs(n: int):
    """``n`` completions that only a checker process decides (irrational forms); those at odd indices are right."""
    golds = [f"\\sqrt{{{k}}}+{k % 7}" for k in range(2, n + 2)]
    preds = [f"{k % 7} + \\sqrt{{{k if i % 2 else k + 1}}}" for i, k in enumerate(range(2, n + 2))]
    return [f"\\boxed{{{p}}}" for p in preds], golds


def test_parallel_path_matches_single_worker_and_in_process_math_verify():
    completions, golds = slow_pairs(40)
    expected = [float(i % 2) for i in range(40)]
    assert [verify_answer(g, last_boxed(c)) for c, g in zip(completions, golds)] == expected
    single = MathReward(num_workers=1, timeout=20.0)
    parallel = MathReward(num_workers=2, parallel_threshold=8, timeout=20.0)
    try:
        assert single(completions=completions, answer=golds) == expected
        assert parallel(completions=completions, answer=golds) == expected
        assert len(parallel._pool.workers) == 2 and len(single._pool.workers) == 1
    finally:
        single.close()
        parallel.close()


def test_cache_skips_the_workers_and_stays_bounded(monkeypatch):
    reward = MathReward(num_workers=1, cache_size=3, timeout=20.0)
    try:
        completions, golds = slow_pairs(5)
        first = reward(completions=completions, answer=golds)
        assert len(reward._cache) == 3
        monkeypatch.setattr(reward._pool, "run", lambda *args: pytest.fail("cached pairs must not be re-checked"))
        assert reward(completions=completions[-3:], answer=golds[-3:]) == first[-3:]
    finally:
        reward.close()


def test_hanging_check_times_out_and_the_spare_replaces_its_worker(caplog):
    reward = MathReward(timeout=1.0, num_workers=1)
    metrics = []
    try:
        assert reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2.0"]) == [1.0]  # start the worker and a spare
        pool = reward._pool
        old, spare = pool.workers[0], pool.spare
        start = time.perf_counter()
        hang = [f"\\boxed{{{HANGS[0]}}}", r"\boxed{2}"]
        assert reward(completions=hang, answer=["1", "2"], log_metric=lambda *m: metrics.append(m)) == [0.0, 1.0]
        assert time.perf_counter() - start < 1.0 + 2.0
        assert old.process.wait(timeout=10) == -signal.SIGKILL
        assert pool.workers == [spare] and pool.spare not in (None, spare)  # the spare took over, a new one starts
        assert "exceeded" in caplog.text
        assert metrics == [("math_reward/screened", 0.0), ("math_reward/timed_out", 0.5)]
        assert reward(completions=[r"\boxed{\sqrt{9}}"], answer=["3"]) == [1.0]  # the replacement works
        assert not any(HANGS[0] in pred for _, pred in reward._cache)  # a timeout is not cached
        processes = [*(w.process for w in pool.workers), pool.spare.process, *pool.killed]
        reward.close()
        assert all(p.returncode is not None for p in processes)  # stopped and reaped
        assert not child_processes() & {p.pid for p in processes}
    finally:
        reward.close()


def test_concurrent_calls_from_threads(reward):
    completions, golds = slow_pairs(8)
    results = [None] * 4

    def call(k):
        results[k] = reward(completions=completions[k::4], answer=golds[k::4])

    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [[float(i % 2) for i in range(8)][k::4] for k in range(4)]


def test_a_forked_child_uses_its_own_checkers_and_leaves_the_parents_alone(reward):
    completions, golds = slow_pairs(30)
    completions, golds, expected = completions[24:], golds[24:], [float(i % 2) for i in range(24, 30)]
    assert reward(completions=completions[:2], answer=golds[:2]) == expected[:2]
    parent_worker = reward._pool.workers[0]
    with reward._lock:  # held by the parent at the fork: the child must not wait for it
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                ok = reward(completions=completions, answer=golds) == expected
                ok = ok and reward._pool.workers[0] is not parent_worker
                _close_pools()  # what the child's exit runs: it stops the child's processes only
            finally:
                os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert parent_worker.process.poll() is None
    assert reward(completions=completions[2:], answer=golds[2:]) == expected[2:]
    assert reward._pool.workers[0] is parent_worker


@pytest.mark.slow
def test_hangs_in_a_large_batch_cost_one_timeout_each_in_parallel():
    completions, golds = slow_pairs(40)
    completions += [f"\\boxed{{{h}}}" for h in HANGS]
    golds += ["1"] * len(HANGS)
    reward = MathReward(timeout=1.0, num_workers=2, parallel_threshold=8)
    try:
        start_workers = [f"\\boxed{{\\sqrt{{{k}}}}}" for k in range(100, 108)]
        reward(completions=start_workers, answer=["\\pi"] * 8)  # 8 checks: both workers start
        start = time.perf_counter()
        scores = reward(completions=completions, answer=golds)
        elapsed = time.perf_counter() - start
        assert scores == [float(i % 2) for i in range(40)] + [0.0] * len(HANGS)
        # 3 timeouts of 1 s on 2 workers; the spare replaces the first, the next wait for a start (~1 s loaded)
        assert elapsed < 3 * 1.0 + 3 * 3.0
    finally:
        reward.close()


def test_a_dead_worker_is_replaced():
    reward = MathReward(timeout=20.0, num_workers=1)
    try:
        assert reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]
        reward._pool.workers[0].process.kill()
        reward._pool.workers[0].process.wait()
        assert reward(completions=[r"\boxed{\sqrt{9}}"], answer=["3"]) == [1.0]
    finally:
        reward.close()


def test_a_worker_dying_mid_check_scores_zero(caplog):
    reward = MathReward(timeout=60.0, num_workers=1)
    try:
        assert reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]
        threading.Timer(0.5, reward._pool.workers[0].process.kill).start()  # dies inside a hanging check
        start = time.perf_counter()
        assert reward(completions=[f"\\boxed{{{HANGS[0]}}}"], answer=["1"]) == [0.0]
        assert time.perf_counter() - start < 10.0 and "crashed" in caplog.text
        assert reward(completions=[r"\boxed{\sqrt{9}}"], answer=["3"]) == [1.0]
    finally:
        reward.close()


numbers = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.decimals(-(10**6), 10**6, allow_nan=False, allow_infinity=False, places=7).map(str),
    st.tuples(st.integers(0, 999), st.integers(1, 999)).map(lambda t: f"\\frac{{{t[0]}}}{{{t[1]}}}"),
    st.tuples(st.integers(0, 999), st.integers(1, 999)).map(lambda t: f"{t[0]}/{t[1]}"),
)


@settings(max_examples=150, deadline=None)
@given(numbers, numbers, st.sampled_from([0, Fraction(1, 10**7), Fraction(1, 10**5), Fraction(1, 3)]))
def test_fast_check_agrees_with_math_verify(gold, pred, shift):
    """Wherever the fast check decides, math-verify decides the same (``shift`` makes near and equal pairs)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if shift and "/" not in pred and "frac" not in pred:
        pred = str(float(Fraction(pred) + shift))
        if "e" in pred:
            return
    fast = fast_score(normalize_answer(gold), normalize_answer(pred))
    if fast is not None:
        assert fast == verify_answer(gold, pred), (gold, pred)


# Answers that keep math-verify busy for seconds to hours (the families of issue 14), with the screen's reason.
SCREENED = [
    (r"10^{10^{10^{10}}}", "huge number"),
    (r"9^{9^{9}}", "huge number"),
    (r"(1+x)^{10^{6}}", "huge number"),
    (r"10^{100000000}", "huge number"),
    (r"x^{x^{x^{x}}}", "exponent tower"),
    ("x^{" * 100 + "2" + "}" * 100, "exponent tower"),
    (r"10^{10}^{10}^{10}", "exponent tower"),
    ("{" * 100 + "1" + "}" * 100, "nesting"),
    ("\\frac{1}{" * 7 + "2" + "}" * 7, "nesting"),
    ("{" * 5000 + "1" + "}" * 5000, "size"),
    ("+".join(["1"] * 20_000), "size"),
    ("x" * 100_000, "size"),
]
# Answers the screen must pass: at its limits, or the gold answers that come closest to them (ORZ, OlympiadBench).
NEAR_LIMITS = [
    r"e^{-x^{2}}", r"2^{2^{n}}", r"x^{y^{z}}", r"3^{6567340}", r"\binom{9891}{1989}", r"\frac{100!}{2^{50}}",
    r"\left(\frac{1}{\sqrt{\frac{a}{b^{2}}}}\right)", "+".join(["1"] * 250),
]


@pytest.mark.parametrize("answer, reason", SCREENED)
def test_screen_rejects_pathological_answers(answer, reason):
    assert screen_answer(answer) == reason


def test_screen_passes_every_gold_answer():
    """No gold answer of the six evaluation sets (all of each), the ORZ fixture or the math-verify agreement tests is
    screened, so the screen changes no decision on them (``benchmarks/rewards.py --orz`` checks the ORZ file)."""
    golds = [gold_answer(g) for name in BENCHMARKS for g in load_math_eval(name)["answer"]]
    golds += [gold_answer(g) for g in GOLDS["orz"]] + SHORTCUT_FORMS + NEAR_LIMITS
    golds += [gold_answer(a) for gold, pred, _ in EQUIVALENCES for a in (gold, pred)]
    golds += [last_boxed(c) for c in slow_pairs(40)[0]] + slow_pairs(40)[1]
    assert len(golds) > 1_600
    assert [a for a in golds if screen_answer(a) is not None] == []


def test_screened_answers_score_zero_without_a_checker_and_are_reported(caplog):
    reward = MathReward(num_workers=1)
    metrics = []
    completions = [f"The answer is \\boxed{{{answer}}}." for answer, _ in SCREENED] + [r"\boxed{42}"]
    scores = reward(completions=completions, answer=["42"] * len(completions), log_metric=lambda *m: metrics.append(m))
    assert scores == [0.0] * len(SCREENED) + [1.0]
    assert reward._pool is None  # no checker process was needed
    assert "12 answer(s) screened out before math-verify (exponent tower 3, huge number 4, nesting 2, size 3)" in (
        caplog.text
    )
    assert metrics == [("math_reward/screened", 12 / 13), ("math_reward/timed_out", 0.0)]


HOSTILE = [
    "__import__('os').system('touch pwned')",
    "\\boxed{__import__('os').system('touch pwned')}",
    "\\boxed{\\input{/etc/passwd}} \\boxed{\\write18{touch pwned}}",
    "\\boxed{" * 1000,
    "\\boxed{" + "{" * 5000 + "}" * 5000 + "}",
    "\\boxed{" + "x" * 100_000 + "}",
    "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 301,
    "\\boxed{" + "é∑∫√😀" * 1000 + "}",
    "\\boxed{\x00\u200b}",
]


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory):
    """A reward whose checker process runs in an empty folder (a file an injected command made would appear)."""
    folder = tmp_path_factory.mktemp("sandbox")
    cwd = os.getcwd()
    os.chdir(folder)
    reward = MathReward(timeout=0.5, num_workers=1)
    try:
        reward(completions=[r"\boxed{x^2}"], answer=["x*x"])
    finally:
        os.chdir(cwd)
    yield reward, folder
    reward.close()


def assert_total(reward, folder, completions, golds):
    start = time.perf_counter()
    scores = reward(completions=completions, answer=golds)
    assert time.perf_counter() - start < len(completions) * (0.5 + 3.0)  # one timeout + restart per completion
    assert all(s in (0.0, 1.0) for s in scores)
    assert list(folder.iterdir()) == [] and not os.path.exists("pwned")
    return scores


def test_hostile_completions(sandboxed):
    reward, folder = sandboxed
    assert assert_total(reward, folder, HOSTILE, ["1"] * len(HOSTILE)) == [0.0] * len(HOSTILE)


hostile_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["\\boxed{", "\\fbox{", "{", "}", "\\", "^{", "\\frac{", "9", "x", " ", "$", "\\}", "ä"]),
             max_size=80).map("".join),
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.one_of(hostile_text, hostile_text.map(lambda t: f"\\boxed{{{t}}}")),
                          st.sampled_from(["1", "\\frac{1}{2}", "x^2", "(1, 2)"])), min_size=1, max_size=4))
def test_random_and_hostile_strings_never_raise(sandboxed, batch):
    reward, folder = sandboxed
    completions, golds = map(list, zip(*batch))
    assert_total(reward, folder, completions, golds)
