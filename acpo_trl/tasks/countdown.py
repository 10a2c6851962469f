"""Task ``countdown`` (TinyZero): reach a target with each given number once and + - * /. Training: a file or Hub
dataset (``dataset_name``), else generated solvable tasks (seeded); held out: ``eval_dataset_name`` or generated
with another seed. Reward ``CountdownReward(countdown_format_score)``. Benchmark ``countdown``: TinyZero's test rows
(a file, ``--data_dir``, or the Hub)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..rewards.countdown import CountdownReward, countdown_reward
from ..utils.number_checks import NON_NEGATIVE, Range, check_numbers
from .registry import BenchmarkSource, Task, TaskSpec, register_task

RANGES = {"countdown_min_numbers": Range(2), "countdown_max_numbers": Range(2),  # checked at construction
          "countdown_format_score": NON_NEGATIVE}
COUNTDOWN_TEST_SPLIT = "train[8001:10002]"  # TinyZero's test rows of Jiayi-Pan/Countdown-Tasks-3to4


@dataclass
class CountdownOptions:
    """Fields of ``countdown``.

    Parameters:
        countdown_min_numbers / countdown_max_numbers (`int`, defaults to `3` / `4`): size of generated tasks.
        countdown_format_score (`float`, defaults to `0.0`): credit for a well-formed wrong answer (TinyZero: 0.1).
    """

    countdown_min_numbers: int = field(default=3, metadata={"help": "Generated Countdown: fewest numbers."})
    countdown_max_numbers: int = field(default=4, metadata={"help": "Generated Countdown: most numbers."})
    countdown_format_score: float = field(default=0.0, metadata={"help": "Countdown format credit (TinyZero: 0.1)."})

    def __post_init__(self):
        check_numbers(self, RANGES)


def build(args, seed: int) -> Task:
    from ..data.countdown import generate_countdown, load_countdown  # deferred: data.countdown imports datasets

    size = (args.countdown_min_numbers, args.countdown_max_numbers)

    def generated(n, offset):
        return generate_countdown(n, num_count=size, seed=seed + offset, template=args.prompt_template)

    train = (load_countdown(args.dataset_name, args.prompt_template, split=args.dataset_train_split)
             if args.dataset_name else generated(args.num_train_tasks, 0))
    held_out = (load_countdown(args.eval_dataset_name, args.prompt_template, split=args.dataset_test_split)
                if args.eval_dataset_name else generated(args.num_eval_tasks, 10_000))  # another seed: unseen tasks
    return Task(train, held_out, [CountdownReward(format_score=args.countdown_format_score)])


def test_rows(source: BenchmarkSource):
    """TinyZero's test rows: ``source.path``, else ``data_dir/countdown/test_nums_target.jsonl``, else the Hub."""
    from ..data.countdown import HUB_ID, load_countdown  # deferred: data.countdown imports datasets

    if source.path is not None:
        return load_countdown(source.path, template=source.template), countdown_reward
    if source.data_dir is not None:
        path = str(Path(source.data_dir) / "countdown" / "test_nums_target.jsonl")
        return load_countdown(path, template=source.template), countdown_reward
    try:
        return load_countdown(HUB_ID, template=source.template, split=COUNTDOWN_TEST_SPLIT), countdown_reward
    except (ConnectionError, OSError) as error:  # offline, or the Hub unreachable
        raise ValueError(
            f"countdown: its default test rows come from the Hub ({HUB_ID}, {COUNTDOWN_TEST_SPLIT}), which cannot be "
            f"reached ({error}). Pass a local file, `countdown=<tasks.jsonl>` with {{\"target\", \"nums\"}} records "
            "(TinyZero's test_nums_target.jsonl, or one written from acpo_trl.data.countdown.generate_countdown), "
            "or --data_dir."
        ) from error


register_task(TaskSpec("countdown", build, CountdownOptions, benchmarks={"countdown": test_rows},
                       summary="Countdown (TinyZero): reach a target with + - * /"))
