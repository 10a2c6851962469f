"""Tasks ``addition`` ("What is a + b?") and ``multiplication`` ("What is a * b?"): generated, seeded problems with
n-digit operands (``acpo_trl.data.arithmetic``), reward ``math_reward`` on the last \\boxed{}. The held-out set is
drawn with another seed and holds no problem twice."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..data.arithmetic import arithmetic_dataset
from ..rewards.math import math_reward
from ..utils.number_checks import NON_NEGATIVE, Range, check_numbers
from .registry import Task, TaskSpec, register_task

logger = logging.getLogger(__name__)

# Field names before the options were shared by both operations (configs written for them still work).
_DEPRECATED = {"addition_digits": "arithmetic_digits", "addition_shots": "arithmetic_shots"}
RANGES = {"arithmetic_digits": Range(1, 9), "arithmetic_shots": NON_NEGATIVE}  # checked at construction


@dataclass
class ArithmeticOptions:
    """Fields of ``addition`` and ``multiplication``.

    Parameters:
        arithmetic_digits (`int`, defaults to `1`): digits of each operand.
        arithmetic_shots (`int`, defaults to `0`): with `prompt_template: chat`, this many solved examples (at most
            6) as earlier turns of the conversation before each question, in place of the instruction.
        addition_digits, addition_shots: deprecated names of the two fields above.
    """

    arithmetic_digits: int = field(default=1, metadata={"help": "Addition / multiplication: digits per operand."})
    arithmetic_shots: int = field(default=0, metadata={"help": "Addition / multiplication (chat): solved examples."})
    addition_digits: int | None = field(default=None, metadata={"help": "Deprecated: arithmetic_digits."})
    addition_shots: int | None = field(default=None, metadata={"help": "Deprecated: arithmetic_shots."})

    def __post_init__(self):
        for old, new in _DEPRECATED.items():
            if getattr(self, old) is not None:
                logger.warning("`%s` is deprecated: it is now `%s` (the same for addition and multiplication).",
                               old, new)
                setattr(self, new, getattr(self, old))
                setattr(self, old, None)
        check_numbers(self, RANGES)


def _arithmetic(op: str):
    def build(args, seed: int) -> Task:
        def draw(n, offset, distinct=False):
            return arithmetic_dataset(n, args.arithmetic_digits, seed + offset, args.prompt_template,
                                      args.arithmetic_shots, distinct=distinct, op=op)

        return Task(draw(args.num_train_tasks, 0), draw(args.num_eval_tasks, 10_000, distinct=True), [math_reward])

    return build


register_task(TaskSpec("addition", _arithmetic("+"), ArithmeticOptions, summary='"What is a + b?", n-digit operands'))
register_task(TaskSpec("multiplication", _arithmetic("*"), ArithmeticOptions,
                       summary='"What is a * b?", n-digit operands'))
