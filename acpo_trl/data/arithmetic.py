"""Arithmetic problems "What is a op b?" (``op`` "+" or "*") with n-digit operands, answer in \\boxed{}.

``arithmetic_dataset`` draws them (seeded); with ``shots`` > 0 (chat template only) the question follows solved
examples as earlier turns of the conversation (user "What is a op b?", assistant "\\boxed{a op b}") instead of the
instruction, so that a small instruct model answers in the format, in a few tokens. Columns: ``prompt``,
``answer``; the reward is ``acpo_trl.rewards.math.math_reward``.
"""

from __future__ import annotations

import operator
import random

from .templates import build_prompt

OPERATIONS = {"+": operator.add, "*": operator.mul}
OPERATION_NAMES = {"+": "additions", "*": "multiplications"}
# The solved examples of ``shots``: they show the answer format in place of the instruction.
SOLVED_EXAMPLES = ((2, 3), (4, 4), (7, 1), (5, 8), (6, 2), (9, 7))


def arithmetic_instruction(op: str = "+") -> str:
    """The instruction of a problem without solved examples (2 op 2 = 4 for both operations)."""
    return f"Put your final answer within \\boxed{{}}, for example: 2 {op} 2 = \\boxed{{4}}."


ADDITION_INSTRUCTION = arithmetic_instruction("+")


def arithmetic_dataset(num_tasks: int, digits: int, seed: int, template: str, shots: int = 0, distinct: bool = False,
                       op: str = "+"):
    """``num_tasks`` problems "What is a op b?" with ``digits``-digit operands (seeded), after ``shots`` solved
    examples (module docstring); with ``distinct``, no problem twice (a held-out set: 100 single-digit problems
    are then all of them)."""
    from datasets import Dataset  # deferred: the datasets library is heavy, and only building a dataset needs it

    if shots and template != "chat":
        raise ValueError(f"ArithmeticOptions.arithmetic_shots={shots}: solved examples are earlier chat turns; set "
                         "prompt_template: chat (or arithmetic_shots: 0).")
    if not 0 <= shots <= len(SOLVED_EXAMPLES):
        raise ValueError(f"ArithmeticOptions.arithmetic_shots={shots}: must be in [0, {len(SOLVED_EXAMPLES)}].")
    compute = OPERATIONS[op]
    history = []
    for a, b in SOLVED_EXAMPLES[:shots]:
        history += [{"role": "user", "content": f"What is {a} {op} {b}?"},
                    {"role": "assistant", "content": f"\\boxed{{{compute(a, b)}}}"}]
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    span = high - low + 1
    if distinct and num_tasks > span**2:
        raise ValueError(f"ACPOScriptArguments.num_eval_tasks={num_tasks}: there are only {span**2} distinct "
                         f"{digits}-digit {OPERATION_NAMES[op]}; ask for at most that many.")
    rng = random.Random(seed)
    pairs = ([divmod(i, span) for i in rng.sample(range(span**2), num_tasks)] if distinct else
             [(rng.randint(0, span - 1), rng.randint(0, span - 1)) for _ in range(num_tasks)])
    rows = {"prompt": [], "answer": []}
    for a, b in ((low + i, low + j) for i, j in pairs):
        if history:
            rows["prompt"].append(history + [{"role": "user", "content": f"What is {a} {op} {b}?"}])
        else:
            rows["prompt"].append(build_prompt(f"What is {a} {op} {b}?", arithmetic_instruction(op), template))
        rows["answer"].append(str(compute(a, b)))
    return Dataset.from_dict(rows)
