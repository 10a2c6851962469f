"""Task ``math``: ORZ-57K (``dataset_name``: a local JSON file or Hub id, default the Hub mirror) for training,
MATH500 (shipped with the package) held out; reward ``math_reward`` (math-verify on the last \\boxed{}).
Benchmarks: the six math sets of ``acpo_trl/data/files/math_eval`` (a file, ``--data_dir``, or the shipped copy),
scored with a 5 s math-verify deadline (training's is 0.9 s)."""

from __future__ import annotations

import functools
from pathlib import Path

from ..data.math import ORZ_HUB_ID, load_math_eval, load_orz
from ..rewards.math import MathReward, math_reward
from .registry import BenchmarkSource, Task, TaskSpec, register_task

MATH_BENCHMARKS = {  # benchmark name -> folder under <data_dir>/math_eval
    "math500": "math500",
    "aime24": "aime24",
    "aime25": "aime25",
    "amc23": "amc23",
    "minerva": "minerva_math",
    "olympiadbench": "olympiadbench",
}
EVAL_MATH_TIMEOUT = 5.0  # seconds per math-verify check when scoring a benchmark


def build(args, seed: int) -> Task:
    train = load_orz(args.dataset_name or ORZ_HUB_ID, template=args.prompt_template, split=args.dataset_train_split)
    held_out = load_math_eval("math500", path=args.eval_dataset_name, template=args.prompt_template)
    return Task(train, held_out, [math_reward])


@functools.lru_cache(maxsize=None)
def eval_math_reward():
    """The benchmarks' math reward: training bounds every check at 0.9 s so that no completion stalls a step, but
    an evaluation must not score 0 a correct answer that is merely slow to verify (the longest Minerva golds took
    1-2 s on a loaded 2-core machine), so its deadline is 5 s. One instance: its checker processes are reused."""
    return MathReward(timeout=EVAL_MATH_TIMEOUT)


def math_set(name: str, source: BenchmarkSource):
    path = source.path
    if path is None and source.data_dir is not None:
        path = str(Path(source.data_dir) / "math_eval" / MATH_BENCHMARKS[name] / "test.jsonl")
    return load_math_eval(name, path=path, template=source.template), eval_math_reward()


register_task(TaskSpec("math", build, benchmarks={name: functools.partial(math_set, name) for name in MATH_BENCHMARKS},
                       summary="ORZ-57K math problems, MATH500 held out"))
