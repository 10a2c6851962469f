"""Countdown: reward rules, safe evaluation, brute-force solver, loader and generator."""

import json
import pickle
import time
from pathlib import Path

import pytest

from acpo_trl.data.countdown import countdown_prompt, generate_countdown, load_countdown
from acpo_trl.rewards.countdown import (
    CountdownReward,
    countdown_reward,
    evaluate_equation,
    solve_countdown,
)

FIXTURES = Path(__file__).parent / "fixtures" / "countdown"
RECORDS = [json.loads(line) for line in (FIXTURES / "test_nums_target.jsonl").read_text().splitlines()]


def answer(equation: str) -> str:
    return f"<think> trying combinations </think>\n<answer> {equation} </answer>"


def score(equation: str, target: int, nums: list[int], format_score: float = 0.0) -> float:
    return CountdownReward(format_score)(None, [answer(equation)], [target], [nums])[0]


def test_solver_solves_every_fixture_task_and_its_equation_scores_one():
    targets, nums = [r["target"] for r in RECORDS], [r["nums"] for r in RECORDS]
    solutions = [solve_countdown(n, t) for n, t in zip(nums, targets)]
    assert None not in solutions
    assert countdown_reward(None, [answer(s) for s in solutions], targets, nums) == [1.0] * len(RECORDS)


def test_solver_reports_unsolvable():
    assert solve_countdown([1, 1], 5) is None
    assert solve_countdown([2, 3], 6) == "2 * 3"
    assert evaluate_equation(solve_countdown([1, 5, 6, 7], 21)) == 21  # needs fractions: 6 / (1 - 5 / 7)


@pytest.mark.parametrize(
    "equation, expected",
    [
        ("(44 + 19) + 35", 1.0),
        ("35+44+19", 1.0),
        ("-(19 - 44 - 35) + 38", 0.0),  # 38 is not given
        ("44 + 19 + 35 - 0", 0.0),  # an extra number
        ("44 + 19 + 44", 0.0),  # 44 reused, 35 missing
        ("44 + 19", 0.0),  # a number missing
        ("44 + 19 + 34", 0.0),  # wrong value, wrong number
        ("44 * 19 / 35", 0.0),  # wrong value
        ("44 + 19 + 35.0", 0.0),  # "." is not allowed
        ("44 + 19 + 35 = 98", 0.0),  # "=" is not allowed
        ("44 + 19 + 35 ** 1", 0.0),
        ("(44 + 19 + 35", 0.0),
        ("44 19 + 35", 0.0),
    ],
)
def test_reward_rules(equation, expected):
    assert score(equation, 98, [44, 19, 35]) == expected


def test_last_answer_block_counts_and_format_credit():
    text = "<answer> 1 + 1 </answer> no wait <answer>(44 + 19) + 35</answer>"
    assert countdown_reward(None, [text], [98], [[44, 19, 35]]) == [1.0]
    tinyzero = CountdownReward(format_score=0.1)
    assert tinyzero(None, [answer("44 + 19 + 34"), answer("44 + 19 + 35"), "no tags", None], [98] * 4,
                    [[44, 19, 35]] * 4) == [0.1, 1.0, 0.0, 0.0]
    assert countdown_reward(None, [answer("44 + 19 + 34")], [98], [[44, 19, 35]]) == [0.0]
    assert countdown_reward(None, [answer("1 + 2")], [None], [[1, 2]]) == [None]
    conversational = [[{"role": "assistant", "content": answer("44 + 19 + 35")}]]
    assert countdown_reward(None, conversational, [98], [[44, 19, 35]]) == [1.0]


def test_reward_is_picklable_and_named_for_trl():
    reward = pickle.loads(pickle.dumps(CountdownReward(format_score=0.1)))
    assert reward.__name__ == "countdown_reward" and reward.format_score == 0.1
    assert countdown_reward.__name__ == "countdown_reward" and countdown_reward.format_score == 0.0


HOSTILE = [
    "1 / 0",
    "(1 + 2) / (3 - 3)",
    "9**9**9",
    "9 ** 9 ** 9 ** 9",
    "(" * 10_000 + "1" + ")" * 10_000,
    "(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
    "1" + ")" * 101,
    "-" * 500 + "1",
    "9" * 5000,
    "٣ + ٤",  # Arabic-Indic digits
    "１ + ２",  # fullwidth digits
    "¹ + ²",
    "__import__('os').system('touch /tmp/pwned_countdown')",
    "().__class__.__bases__[0].__subclasses__()",
    "lambda: 1",
    "1e308 * 1e308",
    "0x10 + 1",
    "1_000 + 2",
]


@pytest.mark.parametrize("equation", HOSTILE)
def test_hostile_equations_score_zero_fast(equation):
    start = time.perf_counter()
    assert evaluate_equation(equation) is None
    assert score(equation, 3, [1, 2]) == 0.0
    assert time.perf_counter() - start < 0.25
    assert not Path("/tmp/pwned_countdown").exists()


def test_hostile_completions_score_zero():
    completions = ["<answer>" * 50_000, "</answer>" * 50_000, "<answer>" + "(" * 100_000 + "</answer>", "", None, 3]
    start = time.perf_counter()
    assert countdown_reward(None, completions, [3] * 6, [[1, 2]] * 6) == [0.0] * 6
    assert time.perf_counter() - start < 1.0


def test_prompt_is_tinyzero_style():
    prompt = countdown_prompt([96, 7, 37, 74], 55)
    assert "Using the numbers [96, 7, 37, 74], create an equation that equals 55." in prompt
    assert "<answer> (1 + 2) / 3 </answer>" in prompt and prompt.endswith("Assistant: <think>")


def test_load_countdown_local_formats():
    jsonl = load_countdown(FIXTURES / "test_nums_target.jsonl")
    assert jsonl.column_names == ["prompt", "target", "nums"] and len(jsonl) == len(RECORDS)
    assert jsonl[0]["target"] == RECORDS[0]["target"] and jsonl[0]["nums"] == RECORDS[0]["nums"]
    parquet = load_countdown(FIXTURES / "test_head5.parquet", template="chat")  # TinyZero's own file
    assert parquet.column_names == ["prompt", "target", "nums"] and parquet[0]["nums"] == [96, 7, 37, 74]
    assert parquet[0]["prompt"][0]["content"].startswith("Using the numbers [96, 7, 37, 74]")


def test_load_countdown_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_countdown(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"target": 3, "numbers": [1, 2]}) + "\n")
    with pytest.raises(KeyError, match="nums"):
        load_countdown(bad)


def test_generator_is_deterministic_and_solvable():
    first = generate_countdown(40, seed=3)
    assert first.column_names == ["prompt", "target", "nums"]
    assert first.to_dict() == generate_countdown(40, seed=3).to_dict()
    assert first["nums"] != generate_countdown(40, seed=4)["nums"]
    assert {len(n) for n in first["nums"]} == {3, 4}
    assert all(10 <= t <= 100 and all(1 <= x <= 100 for x in n) for t, n in zip(first["target"], first["nums"]))
    solutions = [solve_countdown(n, t) for n, t in zip(first["nums"], first["target"])]
    assert countdown_reward(None, [answer(s) for s in solutions], first["target"], first["nums"]) == [1.0] * 40


@pytest.mark.parametrize("size", [2, 5, 6])
def test_generator_any_size_is_solvable(size):
    tasks = generate_countdown(3, num_count=size, max_number=50, seed=size)
    assert all(len(n) == size for n in tasks["nums"])
    assert all(solve_countdown(n, t) is not None for n, t in zip(tasks["nums"], tasks["target"]))


def test_generator_large_sizes_and_bad_arguments():
    tasks = generate_countdown(5, num_count=12, seed=0)
    assert all(len(n) == 12 and 10 <= t <= 100 for n, t in zip(tasks["nums"], tasks["target"]))
    with pytest.raises(ValueError, match="num_count"):
        generate_countdown(1, num_count=1)
    with pytest.raises(ValueError, match="target_range"):
        generate_countdown(1, target_range=(10**9, 10**9 + 1), max_tries=5)
