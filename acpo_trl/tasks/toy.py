"""Task ``toy``, for the tiny local models (``acpo_trl.utils.tiny_models``): the prompt names a letter, the reward is
the mean closeness of the completion's characters to that letter (1 for the letter itself, falling to 0 sixteen
code points away). A random byte-level policy earns partial credit on about one character in eight, so every group
has reward variance for GRPO advantages, and the tiny model learns the task in a few dozen steps."""

from __future__ import annotations

import random
from typing import Any

from ..rewards.common import completion_text
from .registry import Task, TaskSpec, register_task

TOY_LETTERS = "abcdefgh"


def toy_dataset(num_prompts: int = 64, seed: int = 0):
    """Prompts ``"Write the letter x:"`` with the letter in a ``letter`` column, as a ``datasets.Dataset``."""
    from datasets import Dataset  # deferred: the datasets library is heavy, and only building a dataset needs it

    rng = random.Random(seed)
    letters = [rng.choice(TOY_LETTERS) for _ in range(num_prompts)]
    return Dataset.from_dict({"prompt": [f"Write the letter {c}:" for c in letters], "letter": letters})


TOY_REWARD_WIDTH = 16


def toy_reward(prompts: list, completions: list, letter: list[str], **kwargs: Any) -> list[float]:
    """Mean over the completion's characters of max(0, 1 - |ord(c) - ord(letter)| / 16); 0 when empty."""
    rewards = []
    for completion, target in zip(completions, letter):
        text = completion_text(completion)
        closeness = [max(0.0, 1 - abs(ord(c) - ord(target)) / TOY_REWARD_WIDTH) for c in text]
        rewards.append(sum(closeness) / len(closeness) if closeness else 0.0)
    return rewards


def build(args, seed: int) -> Task:
    return Task(toy_dataset(args.num_train_tasks, seed), toy_dataset(args.num_eval_tasks, seed + 10_000), [toy_reward])


register_task(TaskSpec("toy", build, summary="the tiny local model's letter task"))
