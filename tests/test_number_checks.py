"""Every number of every config is checked at construction, before anything loads (acpo_trl/utils/number_checks.py): NaN
and infinities in any float field, inherited ones included, found by walking the dataclasses (no hand-kept list);
values outside the ranges of the configs' tables."""

from __future__ import annotations

import argparse
import math
import typing
from dataclasses import fields

import pytest

from conftest import trainer_kwargs


def float_fields(cls) -> list[str]:
    """Every field of ``cls`` that holds a float or None, inherited ones included: dataclasses.fields and the type
    hints, not a list."""
    hints = typing.get_type_hints(cls)
    return [f.name for f in fields(cls)
            if float in ((set(typing.get_args(hints[f.name])) - {type(None)}) or {hints[f.name]})]


def refusal(make, name: str, value) -> str:
    with pytest.raises(ValueError) as info:
        make(**{name: value})
    return str(info.value)


def outside(bound) -> list:
    """A value just below and (when bounded) just above ``bound``."""
    values = [bound.low if bound.low_open else bound.low - 1]
    if bound.high < math.inf:
        values.append(bound.high if bound.high_open else bound.high + 1)
    return values


def test_every_float_field_of_acpo_config_refuses_nan_and_infinities(tmp_path):
    """Inherited from TrainingArguments and GRPOConfig or added by ACPOConfig: NaN (which passes every comparison),
    +inf and -inf fail at construction naming the field; the float fields ACPOConfig adds also refuse negatives."""
    from trl import GRPOConfig

    from acpo_trl import ACPOConfig
    from acpo_trl.recipe import make_parser

    make_parser()  # HfArgumentParser resolves the fields' types in place: the check must not depend on their form
    names = float_fields(ACPOConfig)
    inherited = {f.name for f in fields(GRPOConfig)}
    assert {"learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "beta",
            "epsilon", "epsilon_high", "delta", "temperature", "top_p", "warmup_steps"} <= set(names)
    assert len([n for n in names if n in inherited]) >= 40
    assert {"acpo_alpha", "dapo_clip_low", "cispo_clip_max", "reweight_c", "drift_guard_threshold"} <= set(names)

    def make(**overrides):
        return ACPOConfig(**trainer_kwargs(tmp_path, **overrides))

    for name in names:
        for bad in (math.nan, math.inf, -math.inf) + ((-0.1,) if name not in inherited else ()):
            message = refusal(make, name, bad)
            assert message.startswith(f"ACPOConfig.{name}={bad!r}: must be a finite number"), (name, message)


def test_the_messages_say_what_a_field_takes_and_its_default(tmp_path):
    from acpo_trl import ACPOConfig

    def make(**overrides):
        return ACPOConfig(**trainer_kwargs(tmp_path, **overrides))

    assert refusal(make, "learning_rate", math.nan) == \
        "ACPOConfig.learning_rate=nan: must be a finite number >= 0 (default 1e-06)."
    assert refusal(make, "top_p", 1.5) == "ACPOConfig.top_p=1.5: must be a finite number in (0, 1] (default 1.0)."
    assert refusal(make, "delta", -1.0) == "ACPOConfig.delta=-1.0: must be a finite number >= 0, or None (the default)."
    assert refusal(make, "per_device_train_batch_size", 0) == \
        "ACPOConfig.per_device_train_batch_size=0: must be an integer >= 1 (default 8)."
    assert refusal(make, "reward_weights", [1.0, math.nan]).startswith(
        "ACPOConfig.reward_weights=[1.0, nan]: must be a list of finite numbers")
    assert refusal(make, "learning_rate", "fast").startswith("ACPOConfig.learning_rate='fast': must be a finite")


def test_every_range_names_a_number_field_of_its_config_and_refuses_values_outside(tmp_path):
    """Each table's fields exist (a field renamed upstream would silently go unchecked) and a value just outside
    the range fails at construction naming the field."""
    from trl import ModelConfig

    from acpo_trl import ACPOConfig
    from acpo_trl.config import INHERITED_RANGES, number_ranges
    from acpo_trl.dlogp.decoding import DECODE_RANGES, DecodeConfig
    from acpo_trl.evaluation.config import EVAL_RANGES, EvalConfig
    from acpo_trl.evaluation.generation import SAMPLING_RANGES, SamplingSettings
    from acpo_trl.utils.number_checks import check_numbers, number_fields
    from acpo_trl.tasks import arithmetic, countdown
    from acpo_trl.tasks.registry import TASK_RANGES
    from acpo_trl.recipe import MODEL_RANGES, SCRIPT_RANGES, script_arguments

    ACPOScriptArguments = script_arguments()  # with every registered task's fields
    script_ranges = {**TASK_RANGES, **SCRIPT_RANGES, **arithmetic.RANGES, **countdown.RANGES}

    assert set(INHERITED_RANGES) < set(number_ranges())
    configs = [
        (ACPOConfig, number_ranges(), lambda **kw: ACPOConfig(**trainer_kwargs(tmp_path, **kw))),
        (ACPOScriptArguments, script_ranges, lambda **kw: ACPOScriptArguments(task="toy", **kw)),
        (EvalConfig, EVAL_RANGES, lambda **kw: EvalConfig(model_name_or_path="m", **kw)),
        (SamplingSettings, SAMPLING_RANGES, SamplingSettings),
        (DecodeConfig, DECODE_RANGES, DecodeConfig),
        (ModelConfig, MODEL_RANGES, lambda **kw: check_numbers(ModelConfig(**kw), MODEL_RANGES)),
    ]
    for cls, ranges, make in configs:
        assert set(ranges) <= set(number_fields(cls)), cls
        for name, bound in ranges.items():
            for value in outside(bound):
                message = refusal(make, name, value)
                assert message.startswith(f"{cls.__name__}.{name}={value!r}: must be") and str(bound) in message
        for name in float_fields(cls):
            assert refusal(make, name, math.nan).startswith(f"{cls.__name__}.{name}=nan: must be a finite number")


def test_argparse_numbers_are_finite_and_in_range():
    from acpo_trl.utils.number_checks import AT_LEAST_ONE, POSITIVE, argument

    learning_rate, steps = argument(float, POSITIVE), argument(int, AT_LEAST_ONE)
    assert (learning_rate("2e-5"), steps("3")) == (2e-5, 3)
    for parse, text, message in ((learning_rate, "nan", "'nan' is not a finite number > 0"),
                                 (learning_rate, "-inf", "'-inf' is not a finite number > 0"),
                                 (learning_rate, "0", "'0' is not a finite number > 0"),
                                 (learning_rate, "fast", "'fast' is not a number"),
                                 (steps, "0", "'0' is not an integer >= 1"), (steps, "1.5", "'1.5' is not an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)
