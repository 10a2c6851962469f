"""MATH task data: ORZ-57K for training, six benchmarks for evaluation (tasks spec, "Math").

Every loader returns a ``datasets.Dataset`` with ``prompt`` (the template's prompt), ``answer`` (the gold answer as a
string, the column ``acpo_trl.rewards.math.math_reward`` reads) and ``problem``; evaluation sets add ``benchmark``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..rewards.math import last_boxed
from .templates import TEMPLATES, build_prompt

MATH_INSTRUCTIONS = {
    # Open-Reasoner-Zero's prompt (the ACPO paper's, for base models): answer in <answer></answer>, value in \boxed{}.
    "base": (
        "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
        "And your final answer will be extracted automatically by the \\boxed{} tag."
    ),
    # The Δlog p paper's instruction (chat template).
    "chat": "Please reason step by step, and put your final answer within \\boxed{}.",
}

ORZ_HUB_ID = "Tonic/OpenReasonerZero"

EVAL_FILES = Path(__file__).parent / "files" / "math_eval"

# benchmark -> (problem field, gold field, rule); the rules are the sources' (Qwen2.5-Math's parse_ground_truth).
BENCHMARKS = {
    "math500": ("problem", "answer", "the string `answer`"),
    "aime24": ("problem", "answer", "the string `answer`, possibly zero-padded (\"025\")"),
    "aime25": ("problem", "answer", "the string `answer`"),
    "amc23": ("problem", "answer", "the float `answer`, as a string (\"27.0\")"),
    "minerva": ("problem", "solution", "the last \\boxed{} of `solution`"),
    "olympiadbench": ("question", "final_answer", "`final_answer[0]` with `$` stripped"),
}


def math_prompt(problem: str, template: str = "base"):
    """The MATH prompt of ``problem`` for ``template`` ("base": ORZ conversation ending ``Assistant: <think>``;
    "chat": one user turn)."""
    if template not in MATH_INSTRUCTIONS:
        raise ValueError(f"Unknown prompt template {template!r}: `template` must be one of {TEMPLATES}.")
    return build_prompt(problem, MATH_INSTRUCTIONS[template], template)


def _dataset(problems: list[str], answers: list[str], template: str, benchmark: str | None = None):
    from datasets import Dataset  # deferred: the datasets library is heavy, and only building a dataset needs it

    columns = {"prompt": [math_prompt(p, template) for p in problems], "answer": answers, "problem": problems}
    if benchmark is not None:
        columns["benchmark"] = [benchmark] * len(problems)
    return Dataset.from_dict(columns)


def _is_hub_id(source: str | Path) -> bool:
    """A source that is no local file or folder and does not look like a path: read from the Hugging Face Hub."""
    path = Path(source)
    return not path.exists() and not path.is_absolute() and path.suffix not in (".json", ".jsonl")


def _orz_pair(record, index: int) -> tuple[str, str]:
    """(question, answer) of one ORZ record: a 2-item list (the JSON file) or a row with columns "0" and "1" (the
    Hub mirror)."""
    try:
        human, assistant = (record["0"], record["1"]) if isinstance(record, dict) else record
        question, answer = human["value"], assistant["ground_truth"]["value"]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"ORZ record {index} is malformed ({error!r}): expected "
            '[{"from": "human", "value": <question>}, {"from": "assistant", "ground_truth": {"value": <answer>}}].'
        ) from None
    if not isinstance(question, str) or answer is None:
        raise ValueError(f"ORZ record {index} has no question string or no ground_truth value: fix or drop it.")
    return question, str(answer)


def load_orz(path_or_id: str | Path = ORZ_HUB_ID, template: str = "base", split: str = "train"):
    """ORZ-57K (Open-Reasoner-Zero's ``orz_math_57k_collected.json``) as a prompt/answer/problem dataset.

    ``path_or_id``: a local JSON file (a list of ``[human, assistant]`` records: ``item[0]["value"]`` is the question,
    ``item[1]["ground_truth"]["value"]`` the answer), or otherwise a Hub dataset id (default: the mirror
    ``Tonic/OpenReasonerZero``, ``split`` of it).
    """
    path = Path(path_or_id)
    if _is_hub_id(path_or_id):
        from datasets import load_dataset  # deferred: the datasets library, for a Hub dataset only

        records = load_dataset(str(path_or_id), split=split)
    elif path.is_file():
        with path.open(encoding="utf-8") as f:
            records = json.load(f)
        if not isinstance(records, list):
            raise ValueError(f"{path} is not an ORZ file: expected a JSON list of [human, assistant] records.")
    else:
        raise FileNotFoundError(
            f"ORZ file {path} not found (or not a file): pass the path of orz_math_57k_collected.json "
            f"or a Hub dataset id such as {ORZ_HUB_ID!r}."
        )
    pairs = [_orz_pair(record, i) for i, record in enumerate(records)]
    return _dataset([q for q, _ in pairs], [a for _, a in pairs], template)


def benchmark_gold(benchmark: str, value) -> str | None:
    """The gold answer string of ``benchmark`` from its gold field's ``value`` (rules in ``BENCHMARKS``)."""
    if benchmark == "minerva":
        return last_boxed(value) if isinstance(value, str) else None
    if benchmark == "olympiadbench":
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        return value.strip("$") if isinstance(value, str) else None
    return None if value is None else str(value)


def _read_records(source: str | Path, benchmark: str) -> list[dict]:
    path = Path(source)
    if _is_hub_id(source):
        from datasets import load_dataset  # deferred: the datasets library, for a Hub dataset only

        return list(load_dataset(str(source), split="test"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{benchmark} file {path} not found: pass `path=` a local .jsonl/.json file with the fields "
            f"{BENCHMARKS[benchmark][:2]} (or a Hub dataset id), or reinstall acpo_trl for its shipped copy."
        )
    with path.open(encoding="utf-8") as f:
        if path.suffix == ".json":
            return json.load(f)
        return [json.loads(line) for line in f if line.strip()]


def load_math_eval(name: str, path: str | Path | None = None, template: str = "base"):
    """One evaluation benchmark (math500, aime24, aime25, amc23, minerva, olympiadbench) as a dataset with columns
    ``prompt``, ``answer`` (gold string), ``problem``, ``benchmark``.

    Reads the copy shipped in ``acpo_trl/data/files/math_eval/<name>.jsonl`` unless ``path`` gives a local .jsonl/.json
    file or a Hub dataset id (split "test") in the source's layout, whose gold field is read by the benchmark's rule.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown math benchmark {name!r}: `name` must be one of {sorted(BENCHMARKS)}.")
    problem_field, gold_field, rule = BENCHMARKS[name]
    records = _read_records(EVAL_FILES / f"{name}.jsonl" if path is None else path, name)
    problems, answers = [], []
    for i, record in enumerate(records):
        missing = [f for f in (problem_field, gold_field) if f not in record]
        if missing:
            raise ValueError(
                f"{name} record {i} has no field {missing[0]!r} (fields: {sorted(record)}): {name} needs "
                f"{problem_field!r} and {gold_field!r} (gold: {rule}); convert the file to that layout."
            )
        gold = benchmark_gold(name, record[gold_field])
        if gold is None:
            raise ValueError(f"{name} record {i}: no gold answer in {gold_field!r} (expected {rule}).")
        problems.append(record[problem_field])
        answers.append(gold)
    return _dataset(problems, answers, template, benchmark=name)
