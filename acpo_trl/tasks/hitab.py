"""Task ``hitab``: HiTab table QA (``dataset_name``: the samples, ``hitab_tables_dir``: the tables; held out:
``eval_dataset_name``), reward ``hitab_reward``. Benchmark ``hitab``: the test samples (a file with its tables, or
``--data_dir``; HiTab's tables are not on the Hub)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..rewards.hitab import hitab_reward
from .registry import BenchmarkSource, Task, TaskSpec, register_task


@dataclass
class HitabOptions:
    """Fields of ``hitab``.

    Parameters:
        hitab_tables_dir (`str`, *optional*): folder of HiTab's `<table_id>.json` files.
    """

    hitab_tables_dir: str | None = field(default=None, metadata={"help": "HiTab: folder of table JSON files."})


def build(args, seed: int) -> Task:
    from ..data.hitab import load_hitab  # deferred: data.hitab imports datasets

    if not args.dataset_name or not args.hitab_tables_dir:
        raise ValueError("task='hitab' needs `dataset_name` (HiTab samples jsonl or Hub id) and `hitab_tables_dir` "
                         "(the folder of <table_id>.json files); `eval_dataset_name` gives the held-out samples.")
    train = load_hitab(args.dataset_name, args.hitab_tables_dir, template=args.prompt_template,
                       split=args.dataset_train_split)
    held_out = load_hitab(args.eval_dataset_name or args.dataset_name, args.hitab_tables_dir,
                          template=args.prompt_template, split=args.dataset_test_split)
    return Task(train, held_out, [hitab_reward])


def test_samples(source: BenchmarkSource):
    from ..data.hitab import load_hitab  # deferred: data.hitab imports datasets

    path, tables = source.path, source.hitab_tables_dir
    if path is None:
        if source.data_dir is None:
            raise ValueError(
                "HiTab needs local files (its tables are not on the Hub): pass `hitab=<samples.jsonl>` with its "
                "tables in `tables/raw` or `tables` beside it or in --hitab_tables_dir, or --data_dir with a `hitab/` "
                "folder.")
        path = str(Path(source.data_dir) / "hitab" / "test_samples.jsonl")
    if tables is None:
        beside = Path(path).parent / "tables"
        tables = str(beside / "raw" if (beside / "raw").is_dir() else beside)
    return load_hitab(path, tables, template=source.template), hitab_reward


register_task(TaskSpec("hitab", build, HitabOptions, benchmarks={"hitab": test_samples},
                       summary="HiTab hierarchical-table question answering"))
