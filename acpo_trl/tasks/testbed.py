"""Tasks ``add1`` and ``add2``: the CPU testbed's fixed addition problems (``acpo_trl/study/testbed.py``, where a
tiny model is trained from scratch on them; docs/RESULTS.md, "Testbed"). As tasks they run with any model: one chat
turn "What is a + b?", reward 1 for exactly one \\boxed{a + b}; the split is seed-independent."""

from __future__ import annotations

from .registry import Task, TaskSpec, register_task

TESTBED_TASKS = ("add1", "add2")


def _testbed(name: str):
    def build(args, seed: int) -> Task:
        from ..study.testbed import addition_reward, rl_dataset, task_problems

        train, held_out = task_problems(name)
        return Task(rl_dataset(train), rl_dataset(held_out), [addition_reward])

    return build


register_task(TaskSpec("add1", _testbed("add1"), summary="the testbed's single-digit additions (70 RL, 30 held out)"))
register_task(TaskSpec("add2", _testbed("add2"), summary="the testbed's two-digit additions (400 RL, 60 held out)"))
