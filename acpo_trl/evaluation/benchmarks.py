"""The benchmark table: each evaluation benchmark's name -> its data loader and its reward.

A benchmark is named (``math500``), or named with a local file (``math500=/data/math500.jsonl``). Without a
file it is read from ``data_dir`` when given (a folder laid out like the project's offline data,
``math_eval/<set>/test.jsonl``, ``hitab/test_samples.jsonl`` + ``hitab/tables/raw``,
``countdown/test_nums_target.jsonl``), else from the data loaders' defaults: the math sets shipped with the
package, Countdown's test rows on the Hugging Face Hub; HiTab always needs local files.
Loaders and rewards are the task modules' own (``acpo_trl.data.*``, ``acpo_trl.rewards.*``).
"""

from __future__ import annotations

import functools

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MATH_BENCHMARKS = {  # name -> folder under <data_dir>/math_eval
    "math500": "math500",
    "aime24": "aime24",
    "aime25": "aime25",
    "amc23": "amc23",
    "minerva": "minerva_math",
    "olympiadbench": "olympiadbench",
}
BENCHMARK_NAMES = (*MATH_BENCHMARKS, "hitab", "countdown")
COUNTDOWN_TEST_SPLIT = "train[8001:10002]"  # TinyZero's test rows of Jiayi-Pan/Countdown-Tasks-3to4


@dataclass
class Benchmark:
    """A prompt dataset (``prompt`` column plus the reward's columns) and the TRL-style reward that scores it."""

    name: str
    dataset: Any  # datasets.Dataset
    reward_func: Callable


EVAL_MATH_TIMEOUT = 5.0  # seconds per math-verify check when scoring a benchmark


@functools.lru_cache(maxsize=None)
def _eval_math_reward():
    """The math reward of the benchmarks: training's bounds every check at 0.9 s so that no completion stalls a step,
    but an evaluation must not score 0 a correct answer that is merely slow to verify (the longest Minerva golds took
    1-2 s on a loaded 2-core machine), so its deadline is 5 s. One instance: its checker processes are reused."""
    from ..rewards.math import MathReward

    return MathReward(timeout=EVAL_MATH_TIMEOUT)


def _math(name: str, path: str | None, data_dir: str | None, template: str, hitab_tables_dir: str | None):
    from ..data.math import load_math_eval

    if path is None and data_dir is not None:
        path = str(Path(data_dir) / "math_eval" / MATH_BENCHMARKS[name] / "test.jsonl")
    return load_math_eval(name, path=path, template=template), _eval_math_reward()


def _hitab(name: str, path: str | None, data_dir: str | None, template: str, hitab_tables_dir: str | None):
    from ..data.hitab import load_hitab
    from ..rewards.hitab import hitab_reward

    if path is None:
        if data_dir is None:
            raise ValueError(
                "HiTab needs local files (its tables are not on the Hub): pass `hitab=<samples.jsonl>` with its "
                "tables in `tables/raw` or `tables` beside it or in --hitab_tables_dir, or --data_dir with a `hitab/` folder."
            )
        path = str(Path(data_dir) / "hitab" / "test_samples.jsonl")
    if hitab_tables_dir is None:
        tables = Path(path).parent / "tables"
        hitab_tables_dir = str(tables / "raw" if (tables / "raw").is_dir() else tables)
    return load_hitab(path, hitab_tables_dir, template=template), hitab_reward


def _countdown(name: str, path: str | None, data_dir: str | None, template: str, hitab_tables_dir: str | None):
    from ..data.countdown import HUB_ID, load_countdown
    from ..rewards.countdown import countdown_reward

    if path is not None:
        return load_countdown(path, template=template), countdown_reward
    if data_dir is not None:
        return load_countdown(str(Path(data_dir) / "countdown" / "test_nums_target.jsonl"), template=template), (
            countdown_reward
        )
    try:
        return load_countdown(HUB_ID, template=template, split=COUNTDOWN_TEST_SPLIT), countdown_reward
    except (ConnectionError, OSError) as error:  # offline, or the Hub unreachable
        raise ValueError(
            f"countdown: its default test rows come from the Hub ({HUB_ID}, {COUNTDOWN_TEST_SPLIT}), which cannot be "
            f"reached ({error}). Pass a local file, `countdown=<tasks.jsonl>` with {{\"target\", \"nums\"}} records "
            "(TinyZero's test_nums_target.jsonl, or one written from acpo_trl.data.countdown.generate_countdown), "
            "or --data_dir."
        ) from error


_LOADERS = {**{name: _math for name in MATH_BENCHMARKS}, "hitab": _hitab, "countdown": _countdown}


def parse_benchmark(spec: str) -> tuple[str, str | None]:
    """``"NAME"`` or ``"NAME=PATH"`` -> ``(name, path or None)``, the name checked against the table."""
    name, _, path = spec.partition("=")
    name = name.strip().lower()
    if name not in _LOADERS:
        raise ValueError(f"Unknown benchmark {name!r} in {spec!r}: use one of {BENCHMARK_NAMES}, optionally as NAME=PATH.")
    if path and not Path(path).exists():
        raise FileNotFoundError(f"Benchmark {spec!r}: no file at {path}.")
    return name, path or None


def load_benchmark(
    spec: str,
    template: str = "base",
    data_dir: str | None = None,
    hitab_tables_dir: str | None = None,
    limit: int | None = None,
) -> Benchmark:
    """The benchmark named by ``spec`` (``NAME`` or ``NAME=PATH``) with prompts in ``template``, its first
    ``limit`` problems only when given."""
    name, path = parse_benchmark(spec)
    dataset, reward_func = _LOADERS[name](name, path, data_dir, template, hitab_tables_dir)
    if limit is not None and limit < len(dataset):
        dataset = dataset.select(range(limit))
    return Benchmark(name=name, dataset=dataset, reward_func=reward_func)
