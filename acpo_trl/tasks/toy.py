"""Task ``toy``: "Write the letter x:" for the tiny local model (``acpo_trl.toy``); reward: closeness of the
completion's characters to the letter."""

from __future__ import annotations

from .registry import Task, TaskSpec, register_task


def build(args, seed: int) -> Task:
    from ..toy import toy_dataset, toy_reward

    return Task(toy_dataset(args.num_train_tasks, seed), toy_dataset(args.num_eval_tasks, seed + 10_000), [toy_reward])


register_task(TaskSpec("toy", build, summary="the tiny local model's letter task"))
