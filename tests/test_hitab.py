"""HiTab: official answer matching, reward on the real fixture samples, table linearisation and loader."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acpo_trl.data.hitab import INSTRUCTION, linearize_table, load_hitab
from acpo_trl.rewards.hitab import _strip_citations, hitab_reward, hitab_score, normalize_item

FIXTURES = Path(__file__).parent / "fixtures" / "hitab"
SAMPLES = FIXTURES / "test_samples.jsonl"
TABLES = FIXTURES / "tables"
RECORDS = [json.loads(line) for line in SAMPLES.read_text().splitlines()]


def stated(items) -> str:
    """A completion giving ``items`` in the format the prompt asks for."""
    return "<think> reading the table </think> <answer> " + " | ".join(str(i) for i in items) + " </answer>"


def test_fixture_is_licensed():
    assert "Computational Use of Data Agreement" in (FIXTURES / "LICENSE_C-UDA.txt").read_text()
    assert len(RECORDS) >= 30 and all((TABLES / f"{r['table_id']}.json").is_file() for r in RECORDS)


def test_every_gold_answer_scores_one_and_perturbations_zero():
    golds = [r["answer"] for r in RECORDS]
    assert hitab_reward(None, [stated(g) for g in golds], golds) == [1.0] * len(golds)
    perturbed = [[a + 0.01 if isinstance(a, (int, float)) else a + " x" for a in g] for g in golds]
    assert hitab_reward(None, [stated(p) for p in perturbed], golds) == [0.0] * len(golds)


def test_loader_answers_round_trip_through_the_reward():
    ds = load_hitab(SAMPLES, TABLES)
    assert ds.column_names == ["prompt", "answer", "table_id", "question"] and len(ds) == len(RECORDS)
    assert hitab_reward(ds["prompt"], [stated(a) for a in ds["answer"]], ds["answer"]) == [1.0] * len(ds)
    assert ds[0]["prompt"].endswith("Assistant: <think>") and INSTRUCTION in ds[0]["prompt"]
    chat = load_hitab(SAMPLES, TABLES, template="chat")
    assert chat[0]["prompt"][0]["role"] == "user" and RECORDS[0]["question"] in chat[0]["prompt"][0]["content"]


@pytest.mark.parametrize(
    "pred, gold, score",
    [
        (["52.1%"], [52.1], 1.0),
        (["52.10"], [52.1], 1.0),
        (["52"], [52.1], 0.0),
        (["0.521"], [52.1], 0.0),
        (["1,234"], [1234], 1.0),
        (["(5)"], [5], 1.0),  # a leading "(" and trailing ")" are stripped, not read as negative
        (["-5"], [5], 0.0),
        (["2.53846"], [2.538462], 1.0),  # |diff| = 2e-6 < 1e-5 absolute
        (["2.54"], [2.538462], 0.0),
        (["Women"], ["women"], 1.0),
        (['"women"[1]'], ["women"], 1.0),
        (["women (2016)"], ["women"], 1.0),
        (["Café–bar."], ["cafe-bar"], 1.0),
        (["52.1"], ["52.1"], 1.0),  # a numeric gold string is a number too
        (["women"], [52.1], 0.0),  # types must match
        (["52.1 percent"], [52.1], 0.0),
        (["men", "women"], ["men", "women"], 1.0),
        (["women", "men"], ["men", "women"], 0.0),  # order matters
        (["men"], ["men", "women"], 0.0),  # length matters
        (["men", "women", "men"], ["men", "women"], 0.0),
        (["1", "2"], [1, 2.0], 1.0),
        (["1", "b"], [1, 2.0], 0.0),
    ],
)
def test_official_rule(pred, gold, score):
    assert hitab_score(pred, gold) == score


def test_reward_format_and_none_gold():
    completions = [
        "<answer>a</answer> on second thought <answer> men | women </answer>",  # the last block counts
        "men | women",  # no answer block
        "<answer> men | women",  # unclosed
        [{"role": "assistant", "content": "<answer>men|women</answer>"}],  # conversational
        "<answer>men, women</answer>",  # not the stated separator: one string item
        "<answer>men | women</answer>",
    ]
    golds = [["men", "women"]] * 5 + [None]
    assert hitab_reward(None, completions, golds) == [1.0, 0.0, 0.0, 1.0, 0.0, None]
    with pytest.raises(ValueError):
        hitab_reward(None, ["<answer>1</answer>"], [])


_CITATIONS = re.compile(r"((?<!^)\[[^\]]*\]|\[\d+\]|[•♦†‡*#+])*$")  # WikiTableQuestions' (backtracking) regex


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="[]1a*# ", max_size=12))
def test_linear_citation_stripping_equals_the_official_regex(x):
    assert _strip_citations(x) == _CITATIONS.sub("", x)


def official_normalize_item(answer: str):
    """HiTab's ``naive_str_to_float(answer.strip().lower())`` with WikiTableQuestions' regex ``normalize``."""
    import unicodedata

    def normalize(x):
        x = "".join(c for c in unicodedata.normalize("NFKD", x) if unicodedata.category(c) != "Mn")
        x = re.sub("[‘’´`]", "'", x)
        x = re.sub("[“”]", '"', x)
        x = re.sub("[‐‑‒–—−]", "-", x)
        while True:
            old_x = x
            x = _CITATIONS.sub("", x.strip())
            x = re.sub(r"(?<!^)( \([^)]*\))*$", "", x.strip())
            x = re.sub(r'^"([^"]*)"$', r"\1", x.strip())
            if x == old_x:
                break
        if x and x[-1] == ".":
            x = x[:-1]
        return re.sub(r"\s+", " ", x, flags=re.U).lower().strip()

    string = answer.strip().lower()
    try:
        sanitized = string[1:] if string[0] == "(" else string
        if sanitized[-1] in "%)":
            sanitized = sanitized[:-1]
        return float(sanitized.replace(",", ""))
    except (IndexError, ValueError):
        return normalize(string)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet='[]1.,%()" aB*•é’–-', max_size=12))
def test_normalize_item_equals_the_official_rule(x):
    expected, got = official_normalize_item(x), normalize_item(x)
    assert type(got) is type(expected) and (got == expected or got != got and expected != expected)


def test_normalize_item_numbers():
    assert normalize_item(3) == 3.0 and normalize_item("(12.5%") == 12.5 and normalize_item(" 1,000 ") == 1000.0
    assert normalize_item("N/A") == "n/a"


def test_linearisation_keeps_hierarchical_headers_and_values():
    table = json.loads((TABLES / "1048.json").read_text())
    text = linearize_table(table)
    assert text.startswith("Table: " + table["title"])
    assert "| immigrant class > family > percent distribution | immigrant class > economic > percent" in text
    assert "| industry > construction of buildings | 3.5 | 2.6 | 1.8 | 2.0 | 4.9 |" in text
    assert "| industry > services to buildings and dwellings | 13.0 | 10.5 | 8.2 | 11.9 | 14.8 |" in text
    values = [v for row in table["texts"][table["top_header_rows_num"]:] for v in row[1:] if v]
    assert all(f"| {v} |" in text or f"| {v}" in text for v in values)


def test_linearisation_multi_column_left_header_and_truncation():
    table = json.loads((TABLES / "100.json").read_text())
    assert "| eastern ontario > french-language workers > percent |" in linearize_table(table)
    truncated = linearize_table(table, max_cells=8)
    assert "| food, beverage, and tobacco processing | 9.7 | 6.0 | 3.0 | 3.3 |" in truncated
    assert "food service" not in truncated and truncated.endswith("(table truncated: 2 of 4 rows shown)")


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_hitab(tmp_path / "missing.jsonl", TABLES)
    with pytest.raises(ValueError, match="max_cells"):
        load_hitab(SAMPLES, TABLES, max_cells=0)
    with pytest.raises(FileNotFoundError, match="tables folder"):
        load_hitab(SAMPLES, tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="'100'.*tables_dir"):
        load_hitab(SAMPLES, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "q", "table_id": "100"}) + "\n")
    with pytest.raises(KeyError, match="`answer`"):
        load_hitab(bad, TABLES)


def test_loader_reads_processed_shards(tmp_path):
    shard = tmp_path / "train_split_shard_90-0.jsonl"
    shard.write_text(json.dumps({"id": "y", "context": "100", "question": "q?", "answer": [52.1], "tokens": []}))
    ds = load_hitab([shard], TABLES)
    assert ds[0]["table_id"] == "100" and ds[0]["answer"] == ["52.1"] and "food service" in ds[0]["prompt"]
