"""The number checks of the configs, run at construction, before anything is loaded.

Every float field of a config dataclass, inherited ones included (found by walking ``dataclasses.fields`` and the
resolved type hints, so a field added later is covered), must hold a finite number: NaN passes every comparison
(``nan < 0`` is False), so it slips through range checks and fails minutes later in the optimizer, or turns every
loss into NaN without a word. A config's table of ``Range`` then bounds the fields, ints included, whose value
outside a range makes no sense (a negative learning rate, a top_p above 1, a batch of 0 rows).
"""

from __future__ import annotations

import argparse
import functools
import math
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Mapping, NamedTuple


@dataclass(frozen=True)
class Range:
    """The numbers from ``low`` to ``high``; ``low_open`` / ``high_open`` leave that end out."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
UNIT = Range(0, 1)  # a fraction or a probability
UNIT_NOT_ZERO = Range(0, 1, low_open=True)  # top_p, a memory fraction
UNIT_NOT_ONE = Range(0, 1, high_open=True)  # Adam's betas


class NumberField(NamedTuple):
    kind: type  # int or float
    optional: bool  # None allowed
    is_list: bool  # a list of numbers
    default: object  # the dataclass default (MISSING when there is none or a factory)


@functools.cache
def number_fields(cls: type) -> dict[str, NumberField]:
    """Every int or float field of the dataclass ``cls`` (bools excluded), inherited ones included, from the resolved
    type hints (a field's ``type`` is a string, or a class once HfArgumentParser has resolved it in place)."""
    hints = typing.get_type_hints(cls)
    found = {}
    for spec in fields(cls):
        hint = hints[spec.name]
        kinds = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
        optional = type(None) in kinds
        kinds.discard(type(None))
        is_list = len(kinds) == 1 and typing.get_origin(next(iter(kinds))) is list
        if is_list:
            kinds = set(typing.get_args(kinds.pop()))
        if kinds in ({int}, {float}):
            found[spec.name] = NumberField(kinds.pop(), optional, is_list, spec.default)
    return found


def check_numbers(config, ranges: Mapping[str, Range]) -> None:
    """Raise ``ValueError("<Class>.<field>=<value>: must be ...")``, saying what the field takes and its default,
    for a float field of the dataclass ``config`` that holds NaN, an infinity or no number, and for a field named in
    ``ranges`` whose value lies outside its range. None passes where the field's type allows it."""
    for name, spec in number_fields(type(config)).items():
        bound = ranges.get(name)
        value = getattr(config, name)
        if (value is None and spec.optional) or (spec.kind is int and bound is None):
            continue
        items = value if spec.is_list and isinstance(value, (list, tuple)) else [value]
        if all(_is_number(item) and (bound is None or item in bound) for item in items):
            continue
        noun = {(float, False): "a finite number", (int, False): "an integer", (float, True): "a list of finite "
                "numbers", (int, True): "a list of integers"}[spec.kind, spec.is_list]
        what = noun + (f" {bound}" if bound else "")
        if spec.default is None:
            what += ", or None (the default)"
        elif spec.default is not MISSING:
            what += f"{', or None' if spec.optional else ''} (default {spec.default!r})"
        raise ValueError(f"{type(config).__name__}.{name}={value!r}: must be {what}.")


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def argument(kind: type, bound: Range | None = None):
    """An argparse ``type``: a finite ``kind`` (int or float), within ``bound`` when given."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a number' if kind is float else 'an integer'}")
        if not _is_number(value) or (bound is not None and value not in bound):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a finite number' if kind is float else 'an integer'}"
                                             f"{f' {bound}' if bound else ''}")
        return value

    return parse
