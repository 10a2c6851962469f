"""Benchmarks by name, read from the task registry (:mod:`acpo_trl.tasks`): each task declares its evaluation
sets (``math500``, ``aime24``, ..., ``hitab``, ``countdown``), and a task that declares none is one under its own
name (its held-out set with the default options: ``addition``, ``multiplication``, ``toy``, ...).

A benchmark is named (``math500``), or named with a local file (``math500=/data/math500.jsonl``). Without a
file it is read from ``data_dir`` when given (a folder laid out like the project's offline data,
``math_eval/<set>/test.jsonl``, ``hitab/test_samples.jsonl`` + ``hitab/tables/raw``,
``countdown/test_nums_target.jsonl``), else from the task's default: the math sets shipped with the package,
Countdown's test rows on the Hugging Face Hub; HiTab always needs local files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Benchmark:
    """A prompt dataset (``prompt`` column plus the reward's columns) and the TRL-style reward that scores it."""

    name: str
    dataset: Any  # datasets.Dataset
    reward_func: Callable


def parse_benchmark(spec: str) -> tuple[str, str | None]:
    """``"NAME"`` or ``"NAME=PATH"`` -> ``(name, path or None)``, the name checked against the registry."""
    from ..tasks import benchmark_names  # deferred: TRL (the task registry imports its ScriptArguments)

    name, _, path = spec.partition("=")
    name = name.strip().lower()
    if name not in benchmark_names():
        raise ValueError(f"Unknown benchmark {name!r} in {spec!r}: use one of {benchmark_names()}, optionally as "
                         "NAME=PATH.")
    if path and not Path(path).exists():
        raise FileNotFoundError(f"Benchmark {spec!r}: no file at {path}.")
    return name, path or None


def load_benchmark(
    spec: str,
    template: str = "base",
    data_dir: str | None = None,
    hitab_tables_dir: str | None = None,
    limit: int | None = None,
    recipe: tuple | None = None,
) -> Benchmark:
    """The benchmark named by ``spec`` (``NAME`` or ``NAME=PATH``) with prompts in ``template``, its first
    ``limit`` problems only when given; ``recipe``: ``(script_args, seed)`` of an ``acpo-train`` recipe, whose
    generated task is evaluated on the recipe's own held-out set (``acpo_trl.tasks.BenchmarkSource``)."""
    from ..tasks import BenchmarkSource, benchmark_loader  # deferred: TRL, as in parse_benchmark

    name, path = parse_benchmark(spec)
    source = BenchmarkSource(path, data_dir, template, hitab_tables_dir, recipe)
    dataset, reward_func = benchmark_loader(name)(source)
    if limit is not None and limit < len(dataset):
        dataset = dataset.select(range(limit))
    return Benchmark(name=name, dataset=dataset, reward_func=reward_func)
