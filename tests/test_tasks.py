"""The task registry (acpo_trl/tasks/): a task is one registration, read by acpo-train, acpo-eval and acpo-study.
A task registered from this test file, with a field of its own, trains through `acpo-train` and is evaluated
through `acpo-eval` (their `main`, in this process, where the registration lives)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pytest
import yaml


@dataclass
class EchoOptions:
    echo_letter: str = field(default="c", metadata={"help": "the letter the echo task asks for"})


def _echo_task(args, seed):
    """The toy task with one letter for every prompt, the letter an option of the task."""
    from datasets import Dataset

    from acpo_trl.tasks import Task
    from acpo_trl.tasks.toy import toy_reward

    def rows(n):
        return Dataset.from_dict({"prompt": [f"Write the letter {args.echo_letter}:"] * n,
                                  "letter": [args.echo_letter] * n})

    return Task(rows(args.num_train_tasks), rows(args.num_eval_tasks), [toy_reward])


@pytest.fixture
def echo_task():
    from acpo_trl.tasks import TaskSpec, register_task
    from acpo_trl.tasks.registry import TASKS

    spec = register_task(TaskSpec("echo", _echo_task, EchoOptions, summary="a test's task"))
    yield spec
    TASKS.pop("echo")


def test_a_task_from_a_test_file_trains_and_evaluates_through_the_command_lines(tmp_path, tiny_dir, echo_task):
    from acpo_trl.evaluation.cli import main as acpo_eval
    from acpo_trl.train import main as acpo_train

    recipe = {"model_name_or_path": tiny_dir, "task": "echo", "echo_letter": "e", "num_train_tasks": 16,
              "num_eval_tasks": 2, "eval_k": 2, "output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False,
              "per_device_train_batch_size": 8, "num_generations": 4, "steps_per_generation": 2,
              "max_completion_length": 4, "learning_rate": 0.01, "max_steps": 2, "logging_steps": 1,
              "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "report": True}
    (tmp_path / "echo.yaml").write_text(yaml.safe_dump(recipe))
    acpo_train(["--config", str(tmp_path / "echo.yaml")])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "# acpo-train report: echo" in report and "| eval/echo/avg@2 |" in report

    acpo_eval(["--model_name_or_path", str(tmp_path / "out"), "--benchmarks", "echo", "--k", "2", "--max_tokens", "4",
               "--output_dir", str(tmp_path / "eval"), "--backend", "transformers", "--device", "cpu"])
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert set(results["metrics"]) == {"echo"} and results["metrics"]["echo"]["num_problems"] == 64  # the default
    assert all(p["prompt"] == "Write the letter c:" for p in results["problems"])  # the option's default


def test_the_registry_refuses_clashes_and_names_the_tasks():
    from acpo_trl.tasks import TaskSpec, get_task, register_task

    with pytest.raises(ValueError, match="task 'addition' is registered already"):
        register_task(TaskSpec("addition", _echo_task))

    @dataclass
    class Clashing:
        arithmetic_digits: int = 2

    with pytest.raises(ValueError, match=r"option field\(s\) \['arithmetic_digits'\] are task 'addition'"):
        register_task(TaskSpec("clash", _echo_task, Clashing))
    with pytest.raises(ValueError, match=r"benchmark\(s\) \['math500'\] belong to task 'math'"):
        register_task(TaskSpec("clash", _echo_task, benchmarks={"math500": lambda source: None}))
    with pytest.raises(ValueError, match=r"task='nope': no such task; choose one of \[.*'addition'.*'toy'"):
        get_task("nope")


def test_old_field_names_keep_working_with_a_message_and_other_tasks_fields_are_flagged(caplog):
    from acpo_trl.recipe import make_parser

    with caplog.at_level(logging.WARNING):
        script_args, _, _ = make_parser().parse_args_and_config(
            args=["--config", "configs/demo.yaml", "--addition_digits", "2", "--countdown_min_numbers", "2"])
    assert script_args.arithmetic_digits == 2 and script_args.addition_digits is None
    assert "`addition_digits` is deprecated: it is now `arithmetic_digits`" in caplog.text
    assert "countdown_min_numbers: field(s) of another task, ignored by task 'addition'" in caplog.text


def test_every_task_builds_from_acpo_trains_arguments():
    """Every built-in task but those that read files builds its datasets and rewards from the script arguments."""
    from acpo_trl.tasks import build_task, registered
    from acpo_trl.recipe import script_arguments

    for name in set(registered()) - {"math", "hitab"}:  # ORZ from the Hub; HiTab from local files (their own tests)
        task = build_task(script_arguments()(task=name, prompt_template="chat", num_train_tasks=4, num_eval_tasks=4))
        assert len(task.train_dataset) >= 4 and len(task.eval_dataset) >= 4 and task.reward_funcs
        assert "prompt" in task.train_dataset.column_names
