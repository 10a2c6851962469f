"""Tasks ``add1`` and ``add2``: the CPU testbed's fixed addition problems (``acpo_trl/data/testbed.py``; the testbed
itself, where a tiny model is trained from scratch on them, is ``acpo_trl/study/testbed.py``; docs/RESULTS.md,
"Testbed"). As tasks they run with any model: one chat turn "What is a + b?", reward 1 for exactly one
\\boxed{a + b}; the split is seed-independent."""

from __future__ import annotations

from ..data.testbed import TESTBED_TASKS, rl_dataset, task_problems
from ..rewards.testbed import addition_reward
from .registry import Task, TaskSpec, register_task

__all__ = ["TESTBED_TASKS"]


def _testbed(name: str):
    def build(args, seed: int) -> Task:
        train, held_out = task_problems(name)
        return Task(rl_dataset(train), rl_dataset(held_out), [addition_reward])

    return build


register_task(TaskSpec("add1", _testbed("add1"), summary="the testbed's single-digit additions (70 RL, 30 held out)"))
register_task(TaskSpec("add2", _testbed("add2"), summary="the testbed's two-digit additions (400 RL, 60 held out)"))
