"""The CPU testbed's reward (tasks ``add1`` and ``add2``): 1 for exactly one \\boxed{N} with N = a + b."""

from __future__ import annotations

import re

from .common import completion_text

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def addition_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 if the completion holds exactly one \\boxed{N} with N the answer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer):
        found = BOXED.findall(completion_text(completion))
        rewards.append(1.0 if len(found) == 1 and found[0].strip() == str(gold) else 0.0)
    return rewards
