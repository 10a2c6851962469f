"""HiTab (Cheng et al., ACL 2022): question answering over hierarchical tables, as a TRL prompt dataset.

Samples are microsoft/HiTab's ``*_samples.jsonl`` (``question``, ``answer`` list, ``table_id``) or its processed
shards (``data/processed_input/.../*.jsonl``, table id in ``context``); tables are its ``tables/raw/<table_id>.json``
files. The table goes into the prompt as text (``linearize_table``): one markdown-like row per table row, each
column headed by its top-header path and each row led by its left-header path (``"Parent > Child"``).

Columns: ``prompt``, ``answer`` (list[str]: gold items, numbers written with ``repr``, which HiTab's matching
reads back as the same number; see ``acpo_trl.rewards.hitab``), ``table_id``, ``question``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from datasets import Dataset, load_dataset

from acpo_trl.data.templates import build_prompt
from acpo_trl.rewards.hitab import ANSWER_FORMAT

DEFAULT_MAX_CELLS = 1000  # values shown; none of the 1,898 tables of test, dev and the train subset has more
INSTRUCTION = (
    "Answer the question from the table. Copy numbers and labels as written in the table; give percentages as "
    "the percent number and computed ratios to 6 decimal places. " + ANSWER_FORMAT
)
_TABLE_KEYS = ("title", "texts", "merged_regions", "top_root", "left_root", "top_header_rows_num",
               "left_header_columns_num")


def _merged_origin(table: dict) -> dict[tuple[int, int], tuple[int, int]]:
    """Each covered cell of a merged region -> the region's top-left cell (the one that holds the text)."""
    origin = {}
    for region in table["merged_regions"]:
        top, left = region["first_row"], region["first_column"]
        for r in range(top, region["last_row"] + 1):
            for c in range(left, region["last_column"] + 1):
                origin[(r, c)] = (top, left)
    return origin


def _path(texts: list[list[str]], cells) -> str:
    """``"A > B"`` from the non-empty texts of ``cells`` (row, col), merged repeats dropped."""
    parts: list[str] = []
    for r, c in cells:
        text = " ".join(str(texts[r][c]).split())
        if text and (not parts or parts[-1] != text):
            parts.append(text)
    return " > ".join(parts)


def _left_paths(table: dict) -> dict[int, list[tuple[int, int]]]:
    """Row -> the cells of its left-header tree path (root first, down to the row's deepest node), for rows
    with a node in ``left_root``.

    Nodes outside the left header columns (unit rows such as "percent" that HiTab hangs at the top of the
    tree) are skipped: the column paths show them.
    """
    n_left = table["left_header_columns_num"]
    paths: dict[int, list[tuple[int, int]]] = {}
    stack = [(table["left_root"], [])]
    while stack:
        node, ancestors = stack.pop()
        cell = (node["row_index"], node["column_index"])
        path = ancestors + [cell] if cell[0] >= 0 and cell[1] < n_left else ancestors
        if cell[0] >= 0 and cell[1] < n_left and len(path) > len(paths.get(cell[0], ())):
            paths[cell[0]] = path
        stack.extend((child, path) for child in node["children"])
    return paths


def linearize_table(table: dict, max_cells: int = DEFAULT_MAX_CELLS) -> str:
    """A HiTab table as text: its title, then markdown-like rows ``| row path | value | ... |`` under a header row
    of column paths. Column paths join the top header rows (merged cells repeated over their span); row paths
    follow the left header tree (``left_root``), or the left header columns for rows outside it. Rows whose
    values are all empty (section labels, already in the paths) are left out. At most ``max_cells`` values are
    shown; the rows cut are counted in a final note."""
    texts = table["texts"]
    n_rows, n_cols = len(texts), len(texts[0]) if texts else 0
    n_top, n_left = table["top_header_rows_num"], table["left_header_columns_num"]
    origin = _merged_origin(table)
    left_paths = _left_paths(table)
    # HiTab sometimes counts a first data row as a header row; its node in the left tree tells.
    header_rows = [r for r in range(min(n_top, n_rows)) if r not in left_paths]

    def cell(r, c):
        return origin.get((r, c), (r, c))

    columns = list(range(n_left, n_cols))
    corner = _path(texts, [cell(r, c) for c in range(n_left) for r in header_rows])
    header = [corner] + [_path(texts, [cell(r, c) for r in header_rows]) for c in columns]
    body = []
    for r in range(n_rows):
        if r in header_rows:
            continue
        values = [" ".join(str(texts[r][c]).split()) for c in columns]
        if not any(values):
            continue
        label = _path(texts, left_paths.get(r) or [cell(r, c) for c in range(n_left)])
        body.append("| " + " | ".join([label] + values) + " |")
    shown = len(body) if not columns else min(len(body), max_cells // len(columns))
    lines = [f"Table: {' '.join(str(table['title']).split())}", "| " + " | ".join(header) + " |", *body[:shown]]
    if shown < len(body):
        lines.append(f"(table truncated: {shown} of {len(body)} rows shown)")
    return "\n".join(lines)


def _read_table(tables_dir: Path, table_id: str) -> dict:
    path = tables_dir / f"{table_id}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"HiTab table {table_id!r} not found: expected {path}. Pass as `tables_dir` the folder of HiTab's "
            "`<table_id>.json` files (microsoft/HiTab data/tables.zip -> tables/raw)."
        )
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    missing = [key for key in _TABLE_KEYS if key not in table]
    if missing:
        raise ValueError(f"HiTab table file {path} lacks {missing}: expected a raw HiTab table ({_TABLE_KEYS}).")
    return table


def _read_samples(samples, split: str) -> list[dict]:
    paths = [samples] if isinstance(samples, (str, os.PathLike)) else list(samples)
    if len(paths) == 1 and isinstance(paths[0], str) and not os.path.exists(paths[0]):
        if os.path.isabs(paths[0]) or paths[0].endswith((".jsonl", ".json")):
            raise FileNotFoundError(f"HiTab samples file not found: {paths[0]}. Pass an existing jsonl file.")
        return list(load_dataset(paths[0], split=split))
    records = []
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"HiTab samples file not found: {path}. Pass an existing jsonl file.")
        with open(path, encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def load_hitab(samples, tables_dir, template: str = "base", max_cells: int = DEFAULT_MAX_CELLS,
               split: str = "test") -> Dataset:
    """HiTab samples with their tables as a prompt dataset (columns in the module docstring).

    ``samples``: a jsonl path (raw ``*_samples.jsonl`` or a processed shard), a list of such paths, or a Hub
    dataset id with the same fields (loaded with ``datasets.load_dataset(samples, split=split)``).
    ``tables_dir``: the folder of ``<table_id>.json`` files. ``template``: "base" or "chat" (``build_prompt``).
    """
    if max_cells < 1:
        raise ValueError(f"`max_cells` must be >= 1 (values of a table shown in the prompt), got {max_cells}.")
    tables_dir = Path(tables_dir)
    if not tables_dir.is_dir():
        raise FileNotFoundError(
            f"HiTab tables folder not found: {tables_dir}. Pass the folder of `<table_id>.json` files (tables/raw)."
        )
    tables: dict[str, str] = {}
    rows = {"prompt": [], "answer": [], "table_id": [], "question": []}
    for i, record in enumerate(_read_samples(samples, split)):
        table_id = record.get("table_id", record.get("context"))
        for field, value in (("question", record.get("question")), ("answer", record.get("answer")),
                             ("table_id", table_id)):
            if value is None:
                raise KeyError(
                    f"HiTab sample {i} ({record.get('id', 'no id')}) has no `{field}`: expected HiTab samples "
                    "with `question`, `answer` (list) and `table_id` (or `context` in processed shards)."
                )
        table_id = str(table_id)
        if table_id not in tables:
            tables[table_id] = linearize_table(_read_table(tables_dir, table_id), max_cells)
        answer = record["answer"] if isinstance(record["answer"], list) else [record["answer"]]
        rows["prompt"].append(build_prompt(f"{tables[table_id]}\n\nQuestion: {record['question']}", INSTRUCTION,
                                           template))
        rows["answer"].append([a if isinstance(a, str) else repr(a) for a in answer])
        rows["table_id"].append(table_id)
        rows["question"].append(record["question"])
    return Dataset.from_dict(rows)
