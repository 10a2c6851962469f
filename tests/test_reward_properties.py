"""Property tests: random and hostile completions never raise, stay fast, score in range and change nothing."""

import copy
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acpo_trl.rewards.countdown import CountdownReward
from acpo_trl.rewards.hitab import hitab_reward
from acpo_trl.rewards.math import MathReward

FRAGMENTS = [
    "<answer>", "</answer>", "<answer> ", " </answer>", "|", " | ", "(", ")", "[1]", "%", ",", ".", "-", "+",
    "*", "/", "**", "9", "0", "12", "1,234", "52.1", "1e308", "nan", "inf", "(5)", '"', "“", "–", "•", "†", " (note)",
    "women", "Café", "\\boxed{", "}", "{", "\\frac{1}{2}", "\\sqrt{", "^", "\\\\", "\n", "\t", " ", "٣", "１", "¹",
    "\u200b", "\x00", "__import__('os').system('touch pwned')", "lambda: 0", "eval(", "9**9**9", "(" * 200,
    ")" * 200, "[" * 50, "10" * 40,
]
hostile_text = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=40).map("".join),
)
completion = st.one_of(
    hostile_text,
    hostile_text.map(lambda t: [{"role": "assistant", "content": t}]),
    st.sampled_from([None, 3, [], [{"role": "assistant"}], [{"content": None}], {"role": "assistant"}]),
)
# the function-scoped fixture is the per-test temporary working directory, shared by the examples on purpose
SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=SLOW_OK)


def check_batch(reward, completions, columns, allowed, max_seconds):
    """Call ``reward`` as TRL does; assert the scores, the time, and that no input or file changed."""
    before = copy.deepcopy((completions, columns))
    files = set(os.listdir("."))
    start = time.perf_counter()
    scores = reward(prompts=["p"] * len(completions), completions=completions, **columns)
    assert time.perf_counter() - start < max_seconds
    assert len(scores) == len(completions) and all(s in allowed for s in scores)
    assert (completions, columns) == before and set(os.listdir(".")) == files
    return scores


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file written by an injected command would show up here


hitab_gold = st.lists(
    st.one_of(st.text(max_size=20), st.floats(allow_nan=True), st.integers(), st.sampled_from(["women", "52.1"])),
    min_size=1, max_size=4,
)


@PROPERTY
@given(st.lists(st.tuples(completion, st.one_of(st.none(), hitab_gold)), min_size=1, max_size=8))
def test_hitab_reward_total_and_fast(batch):
    completions, golds = map(list, zip(*batch))
    scores = check_batch(hitab_reward, completions, {"answer": golds}, {0.0, 1.0, None}, 1.0)
    assert [s is None for s in scores] == [g is None for g in golds]


@PROPERTY
@given(
    st.lists(
        st.tuples(completion, st.integers(-10**6, 10**6), st.lists(st.integers(-10**9, 10**9), max_size=6)),
        min_size=1, max_size=8,
    ),
    st.sampled_from([0.0, 0.1]),
)
def test_countdown_reward_total_and_fast(batch, format_score):
    completions, targets, nums = map(list, zip(*batch))
    check_batch(CountdownReward(format_score), completions, {"target": targets, "nums": nums},
                {0.0, format_score, 1.0}, 1.0)


@PROPERTY
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=80).map("".join), st.sampled_from([[3, 4], [1, 2, 3]]))
def test_countdown_hostile_equations_in_answer_tags(equation, nums):
    check_batch(CountdownReward(), [f"<answer>{equation}</answer>"], {"target": [7], "nums": [nums]},
                {0.0, 1.0}, 0.5)


def test_pathological_hitab_answers_are_bounded():
    worst = ["a" + " (x)[1]" * 285, "a" + " (" * 999, "a" + "[1]" * 666, "<answer>" * 10_000, "x" * 100_000]
    check_batch(hitab_reward, [f"<answer>{w}</answer>" for w in worst], {"answer": [["a"]] * len(worst)},
                {0.0, 1.0}, 1.0)


@pytest.fixture(scope="module")
def math_checker():
    reward = MathReward(timeout=2.0, num_workers=1)
    reward(completions=["\\boxed{x^2}"], answer=["x*x"])  # start the checker process once
    yield reward
    reward.close()


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(st.lists(st.tuples(st.one_of(completion, hostile_text.map(lambda t: f"\\boxed{{{t}}}")),
                          st.one_of(st.none(), st.text(max_size=20), st.sampled_from(["1/2", "025", "\\frac{1}{2}"]))),
                min_size=1, max_size=4))
def test_math_reward_total_and_bounded(math_checker, batch):
    completions, golds = map(list, zip(*batch))
    # each completion may need one math-verify check, each bounded by the 2 s timeout (plus a worker restart)
    check_batch(math_checker, completions, {"answer": golds}, {0.0, 1.0, None}, 2 + 4.0 * len(batch))
