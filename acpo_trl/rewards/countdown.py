"""Countdown reward (TinyZero ``verl/utils/reward_score/countdown.py``, ACPO paper scoring) and an exact solver.

Rule: take the LAST ``<answer>...</answer>`` of the completion; the equation may hold only ASCII digits,
``+ - * / ( )`` and whitespace; its integer literals must be exactly the multiset ``nums``; its value must equal
``target`` within 1e-5. Then the reward is 1.0; an answer block that fails any check scores ``format_score``
(0.0 in the ACPO paper, 0.1 in TinyZero); no answer block scores 0.0.

The equation is tokenised and parsed here (recursive descent, exact integer/``Fraction`` arithmetic, unary ``+``/``-``
as in Python) and never passed to ``eval``. Length and nesting are bounded and division by zero fails the
answer, so no completion can raise, hang or run code.
"""

from __future__ import annotations

import re
from fractions import Fraction
from itertools import combinations

from acpo_trl.rewards.common import completion_text

TOLERANCE = 1e-5
MAX_EQUATION_CHARS = 1000
MAX_DEPTH = 100  # nested parentheses / unary signs

_OPEN, _CLOSE = "<answer>", "</answer>"
_ALLOWED = re.compile(r"[0-9+\-*/() \t\r\n]*")
_TOKEN = re.compile(r"[0-9]+|\S")
_INTEGER = re.compile(r"[0-9]+")


class _Invalid(Exception):
    """The equation does not parse or cannot be evaluated."""


class _Parser:
    """Recursive descent over ``expr := term (("+"|"-") term)*``, ``term := factor (("*"|"/") factor)*``,
    ``factor := ("+"|"-") factor | INTEGER | "(" expr ")"``, evaluated on the fly, exactly: integers, and
    Fractions once a division is inexact."""

    def __init__(self, equation: str):
        self.tokens = _TOKEN.findall(equation)
        self.tokens.append("")  # end marker
        self.pos = 0
        self.depth = 0

    def parse(self) -> int | Fraction:
        value = self.expr()
        if self.tokens[self.pos]:
            raise _Invalid
        return value

    def expr(self) -> int | Fraction:
        value = self.term()
        while (op := self.tokens[self.pos]) in ("+", "-"):
            self.pos += 1
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> int | Fraction:
        value = self.factor()
        while (op := self.tokens[self.pos]) in ("*", "/"):
            self.pos += 1
            right = self.factor()
            if op == "*":
                value = value * right
            elif right == 0:
                raise _Invalid
            elif type(value) is int and type(right) is int and value % right == 0:
                value = value // right
            else:
                value = Fraction(value) / right
        return value

    def factor(self) -> int | Fraction:
        token = self.tokens[self.pos]
        self.pos += 1
        if token.isdigit():
            return int(token)
        if token not in ("+", "-", "("):
            raise _Invalid
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Invalid
        if token == "(":
            value = self.expr()
            if self.tokens[self.pos] != ")":
                raise _Invalid
            self.pos += 1
        else:
            value = self.factor() if token == "+" else -self.factor()
        self.depth -= 1
        return value


def _well_formed(equation: str) -> bool:
    return len(equation) <= MAX_EQUATION_CHARS and _ALLOWED.fullmatch(equation) is not None


def _value(equation: str) -> int | Fraction | None:
    try:
        return _Parser(equation).parse()
    except _Invalid:
        return None


def evaluate_equation(equation: str) -> int | Fraction | None:
    """The exact value of an equation over the allowed characters, or None (bad character or syntax, division
    by zero, longer than ``MAX_EQUATION_CHARS``, nested deeper than ``MAX_DEPTH``)."""
    return _value(equation) if _well_formed(equation) else None


def extract_equation(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` block, or None."""
    end = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len(_OPEN) : end]


def score_equation(equation: str, nums, target) -> bool:
    """Whether ``equation`` uses exactly the multiset ``nums`` and equals ``target`` within 1e-5."""
    if not _well_formed(equation) or sorted(map(int, _INTEGER.findall(equation))) != sorted(map(int, nums)):
        return False
    value = _value(equation)
    return value is not None and abs(value - (target if type(target) is int else Fraction(target))) < TOLERANCE


class CountdownReward:
    """TRL reward for Countdown (columns ``target``: int, ``nums``: list[int]); see the module docstring.

    ``format_score`` is what an answer block that fails the checks earns: 0.0 (ACPO paper, default) or 0.1
    (TinyZero). A row whose ``target`` or ``nums`` is None gets None (TRL ignores it).
    """

    __name__ = "countdown_reward"

    def __init__(self, format_score: float = 0.0):
        self.format_score = float(format_score)

    def __repr__(self) -> str:
        return f"CountdownReward(format_score={self.format_score})"

    def __call__(self, prompts, completions, target, nums, **kwargs) -> list[float | None]:
        rewards: list[float | None] = []
        for completion, goal, numbers in zip(completions, target, nums, strict=True):
            if goal is None or numbers is None:
                rewards.append(None)
                continue
            equation = extract_equation(completion_text(completion))
            if equation is None:
                rewards.append(0.0)
            else:
                rewards.append(1.0 if score_equation(equation, numbers, goal) else self.format_score)
        return rewards


countdown_reward = CountdownReward()


def solve_countdown(nums, target) -> str | None:
    """An equation using every number of ``nums`` once that equals ``target`` exactly, or None if there is none.

    Brute force over all pairings, operators and orders (every binary expression tree), exact arithmetic;
    states already explored are skipped, which keeps 4 numbers instantaneous and 6 numbers to seconds at most.
    """
    goal = Fraction(target)
    seen: set[tuple[Fraction, ...]] = set()

    def search(items):
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(value for value, _ in items))
        if key in seen:
            return None
        seen.add(key)
        for i, j in combinations(range(len(items)), 2):
            rest = tuple(item for k, item in enumerate(items) if k not in (i, j))
            (a, ea), (b, eb) = items[i], items[j]
            options = [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})"), (a - b, f"({ea} - {eb})"),
                       (b - a, f"({eb} - {ea})")]
            if b != 0:
                options.append((a / b, f"({ea} / {eb})"))
            if a != 0:
                options.append((b / a, f"({eb} / {ea})"))
            for option in options:
                found = search(rest + (option,))
                if found is not None:
                    return found
        return None

    found = search(tuple((Fraction(int(n)), str(int(n))) for n in nums))
    return None if found is None else found[1:-1] if found.startswith("(") else found
