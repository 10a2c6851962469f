"""Countdown (TinyZero): reach ``target`` with each of ``nums`` used once and + - * /, as a TRL prompt dataset.

``load_countdown`` reads records ``{"target": int, "nums": [int, ...]}`` (the Hub dataset
``Jiayi-Pan/Countdown-Tasks-3to4`` or local jsonl/json/parquet files, e.g. TinyZero's parquet);
``generate_countdown`` draws new solvable tasks of any size. Columns: ``prompt``, ``target``, ``nums``.
The prompt is TinyZero's instruction; the reward is ``acpo_trl.rewards.countdown``.
"""

from __future__ import annotations

import os
import random

from datasets import Dataset, load_dataset

from acpo_trl.data.templates import build_prompt

HUB_ID = "Jiayi-Pan/Countdown-Tasks-3to4"
INSTRUCTION = (
    "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, "
    "for example <answer> (1 + 2) / 3 </answer>."
)
_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def countdown_prompt(nums, target, template: str = "base"):
    """TinyZero's Countdown prompt for one task, wrapped in ``template`` (``build_prompt``)."""
    question = (
        f"Using the numbers {list(nums)}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number exactly once."
    )
    return build_prompt(question, INSTRUCTION, template)


def _with_prompts(dataset: Dataset, template: str) -> Dataset:
    return dataset.map(
        lambda row: {"prompt": countdown_prompt(row["nums"], row["target"], template)},
        remove_columns=[c for c in dataset.column_names if c not in ("target", "nums")],
    ).select_columns(["prompt", "target", "nums"])


def load_countdown(path_or_id: str = HUB_ID, template: str = "base", split: str = "train") -> Dataset:
    """Countdown tasks from a local ``.jsonl``/``.json``/``.parquet`` file or a Hub dataset id (``split`` of it).

    Records need ``target`` (int) and ``nums`` (list of int); other columns (TinyZero's ``prompt``, ...) are
    dropped and the prompt is rebuilt with ``template``.
    """
    path_or_id = os.fspath(path_or_id)
    suffix = os.path.splitext(path_or_id)[1].lower()
    if os.path.exists(path_or_id):
        if suffix not in _LOCAL_FORMATS:
            raise ValueError(f"Countdown file {path_or_id}: unknown format {suffix!r}; use .jsonl, .json or .parquet.")
        dataset = load_dataset(_LOCAL_FORMATS[suffix], data_files=path_or_id, split="train")
    elif suffix in _LOCAL_FORMATS or os.path.isabs(path_or_id):
        raise FileNotFoundError(f"Countdown file not found: {path_or_id}. Pass an existing file or a Hub id.")
    else:
        dataset = load_dataset(path_or_id, split=split)
    missing = [c for c in ("target", "nums") if c not in dataset.column_names]
    if missing:
        raise KeyError(
            f"Countdown data {path_or_id} has no {missing} column(s) (it has {dataset.column_names}): expected "
            'records {"target": int, "nums": [int, ...]}.'
        )
    return _with_prompts(dataset, template)


def _random_task(rng: random.Random, count: int, max_number: int, target_range: tuple[int, int]):
    """Draw ``count`` numbers in 1..max_number and combine them all in a random order with random operators
    whose results stay positive integers; return (nums, target) if the target is in ``target_range``."""
    nums = [rng.randint(1, max_number) for _ in range(count)]
    pool = list(nums)
    while len(pool) > 1:
        a, b = (pool.pop(rng.randrange(len(pool))) for _ in range(2))
        a, b = max(a, b), min(a, b)
        results = [a + b, a * b] + ([a - b] if a > b else []) + ([a // b] if a % b == 0 else [])
        pool.append(rng.choice(results))
    target = pool[0]
    return (nums, target) if target_range[0] <= target <= target_range[1] else None


def generate_countdown(num_tasks: int, num_count: int | tuple[int, int] = (3, 4), max_number: int = 100,
                       seed: int = 0, target_range: tuple[int, int] = (10, 100), template: str = "base",
                       max_tries: int = 1000) -> Dataset:
    """``num_tasks`` new solvable Countdown tasks, the same for the same arguments (``random.Random(seed)``).

    Each task draws its size uniformly from ``num_count`` (an int, or an inclusive (min, max) range), numbers in
    1..``max_number``, and builds its target by combining all of them (see ``_random_task``), so the task is
    solvable by construction. Targets outside ``target_range`` are redrawn, up to ``max_tries`` times per task.
    Defaults match ``Jiayi-Pan/Countdown-Tasks-3to4`` (3-4 numbers below 100, targets 10-100).
    """
    low, high = (num_count, num_count) if isinstance(num_count, int) else num_count
    if not 2 <= low <= high or max_number < 1 or target_range[0] > target_range[1]:
        raise ValueError(
            f"generate_countdown: need 2 <= num_count ({num_count}), max_number >= 1 ({max_number}) and an "
            f"ordered target_range ({target_range})."
        )
    rng = random.Random(seed)
    rows = {"prompt": [], "target": [], "nums": []}
    for i in range(num_tasks):
        count = rng.randint(low, high)
        for _ in range(max_tries):
            task = _random_task(rng, count, max_number, target_range)
            if task is not None:
                break
        else:
            raise ValueError(
                f"generate_countdown: no target in {target_range} after {max_tries} draws of {count} numbers "
                f"up to {max_number} (task {i}); widen `target_range` or raise `max_tries`."
            )
        nums, target = task
        rows["prompt"].append(countdown_prompt(nums, target, template))
        rows["target"].append(target)
        rows["nums"].append(nums)
    return Dataset.from_dict(rows)
