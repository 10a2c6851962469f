"""The CPU testbed's addition problems (tasks ``add1`` and ``add2``; docs/RESULTS.md, "Testbed"): fixed and
seed-independent.

    add1  all 100 pairs a, b in 0..9; 30 held out (14 with a carry, 16 without), 70 RL prompts (the testbed).
    add2  two-digit operands (10..99): 2- or 3-digit answers, so several answer tokens fall in the low
          probability bins; 400 RL prompts, 60 held out (half with a units carry).

Prompt: one chat turn "What is a + b?"; the answer the reward reads (``acpo_trl.rewards.testbed``) is a + b.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TESTBED_TASKS = ("add1", "add2")


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def carry(self) -> bool:
        return (self.a % 10) + (self.b % 10) >= 10

    @property
    def question(self) -> str:
        return f"What is {self.a} + {self.b}?"


def task_problems(task: str) -> tuple[list[Problem], list[Problem]]:
    """(RL prompts, held-out problems) of ``task`` (fixed, seed-independent)."""
    rng = random.Random(1234)
    if task == "add1":
        pairs = [Problem(a, b) for a in range(10) for b in range(10)]
        carry = [p for p in pairs if p.carry]
        plain = [p for p in pairs if not p.carry]
        rng.shuffle(carry)
        rng.shuffle(plain)
        held = carry[:14] + plain[:16]
        return [p for p in pairs if p not in held], held
    if task == "add2":
        pairs = [Problem(a, b) for a in range(10, 100) for b in range(10, 100)]
        rng.shuffle(pairs)
        carry = [p for p in pairs if p.carry][:30]
        plain = [p for p in pairs if not p.carry][:30]
        held = set(carry + plain)
        return [p for p in pairs if p not in held][:400], carry + plain
    raise ValueError(f"Unknown study task {task!r}: choose one of {TESTBED_TASKS}.")


def rl_dataset(problems: list[Problem]):
    """TRL dataset: conversational ``prompt`` and the ``answer`` the reward reads."""
    from datasets import Dataset  # deferred: the datasets library is heavy, and only building a dataset needs it

    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": p.question}] for p in problems],
        "answer": [str(p.answer) for p in problems],
        "carry": [p.carry for p in problems],
    })
