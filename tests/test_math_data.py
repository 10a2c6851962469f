"""MATH data loaders: the shipped evaluation sets, local files in the sources' layout, ORZ-57K, prompts and errors."""

import json
from pathlib import Path

import pytest

import acpo_trl
from acpo_trl.data import math as math_data
from acpo_trl.data.math import BENCHMARKS, EVAL_FILES, ORZ_HUB_ID, load_math_eval, load_orz, math_prompt
from acpo_trl.rewards.math import last_boxed

FIXTURES = Path(__file__).parent / "fixtures" / "math"
ROWS = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272, "olympiadbench": 675}
# aime25 answers as published by MathArena (answers.csv of AIME 2025 I and II)
AIME25 = ("70 588 16 117 279 504 821 77 62 81 259 510 204 60 735 "
          "468 49 82 106 336 293 237 610 149 907 113 19 248 104 240")
CHAT_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def spec_gold(name: str, record: dict) -> str:
    """The gold answer by the data README's rule for each benchmark."""
    if name == "minerva":
        return last_boxed(record["solution"])
    if name == "olympiadbench":
        return record["final_answer"][0].strip("$")
    return str(record["answer"])


def test_benchmark_table_is_complete():
    assert set(BENCHMARKS) == set(ROWS)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_shipped_benchmark_loads_offline(name):
    ds = load_math_eval(name)
    assert Path(EVAL_FILES).is_relative_to(Path(acpo_trl.__file__).parent)
    assert len(ds) == ROWS[name]
    assert ds.column_names == ["prompt", "answer", "problem", "benchmark"]
    assert set(ds["benchmark"]) == {name}
    assert all(isinstance(a, str) and a for a in ds["answer"])
    for prompt, problem in zip(ds["prompt"], ds["problem"]):
        assert prompt == math_prompt(problem, "base") and prompt.endswith("Assistant: <think>")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_shipped_and_fixture_golds_follow_the_spec_field(name):
    """Every fixture record (20 real records in the source layout) is in the shipped file with the same gold."""
    records = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    fixture = load_math_eval(name, path=FIXTURES / f"{name}.jsonl")
    assert len(fixture) == 20
    assert fixture["answer"] == [spec_gold(name, r) for r in records]
    shipped = load_math_eval(name)
    shipped_golds = dict(zip(shipped["problem"], shipped["answer"]))
    assert {p: shipped_golds.get(p) for p in fixture["problem"]} == dict(zip(fixture["problem"], fixture["answer"]))


def test_known_golds():
    assert load_math_eval("aime25")["answer"] == AIME25.split()
    assert load_math_eval("amc23")["answer"][:3] == ["27.0", "36.0", "45.0"]  # floats in the source
    assert load_math_eval("minerva")["answer"][0] == "1.6"  # the box of `solution`
    assert load_math_eval("math500")["answer"][0] == r"\left( 3, \frac{\pi}{2} \right)"
    olympiad = load_math_eval("olympiadbench")["answer"]
    assert not any(a.startswith("$") or a.endswith("$") for a in olympiad)


def test_prompt_templates():
    problem = "What is $1+1$?"
    base = math_prompt(problem, "base")
    assert base.startswith("A conversation between User and Assistant.")
    assert f"User: {problem}\n" in base and "<answer> </answer>" in base and "\\boxed{}" in base
    assert base.endswith("Assistant: <think>")
    assert math_prompt(problem, "chat") == [{"role": "user", "content": problem + CHAT_INSTRUCTION}]
    chat = load_math_eval("aime24", template="chat")
    assert chat[0]["prompt"] == [{"role": "user", "content": chat[0]["problem"].strip() + CHAT_INSTRUCTION}]
    with pytest.raises(ValueError, match="'plain'.*template"):
        load_math_eval("aime24", template="plain")


def test_load_orz_fixture():
    records = json.loads((FIXTURES / "orz.json").read_text())
    ds = load_orz(FIXTURES / "orz.json")
    assert len(ds) == 30 and ds.column_names == ["prompt", "answer", "problem"]
    assert ds["answer"] == [r[1]["ground_truth"]["value"] for r in records]
    assert ds["problem"] == [r[0]["value"] for r in records]
    assert ds[0]["answer"] == "n = 4" and ds[0]["prompt"].endswith("Assistant: <think>")
    assert load_orz(str(FIXTURES / "orz.json"), template="chat")[1]["prompt"][0]["content"].endswith(CHAT_INSTRUCTION)


def test_load_orz_from_the_hub_layout(monkeypatch):
    """The Hub mirror's rows have columns "0" and "1" (the JSON loader's reading of the 2-item records)."""
    calls = []
    rows = [{"0": {"from": "human", "value": "Find $x$."}, "1": {"from": "assistant", "ground_truth": {"value": "3"}}}]

    def fake_load_dataset(path, split):
        calls.append((path, split))
        return rows

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    ds = load_orz()
    assert calls == [(ORZ_HUB_ID, "train")]
    assert (ds["problem"], ds["answer"]) == (["Find $x$."], ["3"])


def test_hub_id_for_an_eval_set(monkeypatch):
    monkeypatch.setattr("datasets.load_dataset", lambda path, split: [{"problem": "1+1?", "answer": "2", "id": 0}])
    ds = load_math_eval("math500", path="HuggingFaceH4/MATH-500")
    assert (ds["problem"], ds["answer"], ds["benchmark"]) == (["1+1?"], ["2"], ["math500"])


def test_errors_name_the_problem_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="'gsm8k'.*aime24"):
        load_math_eval("gsm8k")
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl.*`path=`"):
        load_math_eval("math500", path=tmp_path / "nowhere.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.json.*Hub dataset id"):
        load_orz(tmp_path / "missing.json")
    minerva = tmp_path / "minerva.jsonl"
    minerva.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match="record 0 has no field 'solution'.*convert"):
        load_math_eval("minerva", path=minerva)
    minerva.write_text(json.dumps({"problem": "p", "solution": "no box"}) + "\n")
    with pytest.raises(ValueError, match="minerva record 0: no gold answer in 'solution'"):
        load_math_eval("minerva", path=minerva)
    orz = tmp_path / "orz.json"
    orz.write_text(json.dumps([[{"from": "human", "value": "q"}, {"from": "assistant", "ground_truth": {"value": "1"}}],
                               [{"from": "human", "value": "q"}, {"from": "assistant"}]]))
    with pytest.raises(ValueError, match="ORZ record 1 is malformed.*ground_truth"):
        load_orz(orz)
    orz.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="not an ORZ file"):
        load_orz(orz)


def test_shipped_files_have_their_licence_notes():
    readme = (Path(math_data.__file__).parent / "files" / "math_eval" / "README.md").read_text()
    for name in ROWS:
        assert f"`{name}.jsonl`" in readme
    assert "MIT" in readme and "CC BY-NC-SA" in readme and "Apache-2.0" in readme
    assert "licence" in (FIXTURES / "README.md").read_text()
