"""Task ``running_sum``: "What is n1 + ... + nm?" answered by a worked running sum, one step per number
(``acpo_trl.data.running_sum``: the styles, the prompt, the length), generated and seeded; only the final box is
rewarded (``math_reward``). Its worked answers are also warm-up data (``TaskSpec.worked_solutions``): a supervised
warm-up (``acpo-warmup``) teaches the format before RL."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.running_sum import RunningSum
from ..rewards.math import math_reward
from ..utils.number_checks import check_numbers
from .registry import Task, TaskSpec, register_task


@dataclass
class RunningSumOptions:
    """Fields of ``running_sum``.

    Parameters:
        running_sum_terms (`int`, defaults to `6`): numbers summed per problem (at least 2); a worked `pairs` answer
            has one step per number after the first (~9.5 tokens each on SmolLM2).
        running_sum_max_term (`int`, defaults to `9`): each number is drawn from 1..this.
        running_sum_unique (`bool`, defaults to `False`): no number twice in a problem (needs `running_sum_max_term`
            >= `running_sum_terms`).
        running_sum_style (`str`, defaults to `"varied"`): how the worked answer is written: `"pairs"` ("3 + 4 = 7,
            7 + 2 = 9, ..."), `"rewrite"` (the sum restated with its first two numbers added, one line per step) or
            `"varied"` (`pairs` with each step phrased in one of a few equivalent ways).
        running_sum_shots (`int`, defaults to `0`): solved examples of the same size, in the same style, as earlier
            chat turns before each question, in place of the instruction (at most 8; needs `prompt_template: chat`;
            0: the instruction with a short worked example).
    """

    running_sum_terms: int = field(default=6, metadata={"help": "Running sum: numbers per problem (>= 2)."})
    running_sum_max_term: int = field(default=9, metadata={"help": "Running sum: numbers drawn from 1..this."})
    running_sum_unique: bool = field(default=False, metadata={"help": "Running sum: no number twice in a problem."})
    running_sum_style: str = field(default="varied", metadata={"help": "Running sum: 'pairs', 'rewrite' or 'varied'."})
    running_sum_shots: int = field(default=0, metadata={"help": "Running sum (chat): worked solved examples."})

    def __post_init__(self):
        check_numbers(self, {})
        if getattr(self, "task", "running_sum") == "running_sum":  # another task's run ignores these fields
            spec(self)  # checks them


def spec(args):
    """The running-sum task ``args``' fields describe (``acpo_trl.data.running_sum.RunningSum``, checked there)."""
    return RunningSum(terms=args.running_sum_terms, max_term=args.running_sum_max_term, shots=args.running_sum_shots,
                      style=args.running_sum_style, unique=args.running_sum_unique,
                      template=getattr(args, "prompt_template", "chat"))


def build(args, seed: int) -> Task:
    train, held_out = spec(args).datasets(args.num_train_tasks, args.num_eval_tasks, seed)
    return Task(train, held_out, [math_reward])


def worked_solutions(args, num_examples: int, seed: int, exclude_seeds: int):
    """``num_examples`` distinct problems with their worked answers (prompt-completion rows), none of them a held-out
    problem of a run with seed ``0..exclude_seeds - 1``."""
    task = spec(args)
    held_out = set()
    for run_seed in range(exclude_seeds):
        held_out |= set(task.held_out_problems(args.num_train_tasks, args.num_eval_tasks, run_seed)[1])
    return task.warmup_dataset(num_examples, seed, exclude=held_out)


register_task(TaskSpec("running_sum", build, RunningSumOptions, worked_solutions=worked_solutions,
                       summary='"What is n1 + ... + nm?" with a worked running sum, the final box rewarded'))
