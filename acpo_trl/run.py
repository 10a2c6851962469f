"""Running a recipe: build its task and ``ACPOTrainer``, evaluate the held-out set before, train, write the report
and save the model (:func:`run`), after checking what the parsed recipe asks for but cannot have
(:func:`check_inputs`). ``acpo-train`` is this behind its command line; the study's drift measurement runs it in
process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from accelerate.utils import broadcast_object_list
from transformers import AutoTokenizer, PrinterCallback, ProgressCallback
from trl.import_utils import is_vllm_available

from .data.templates import drop_long_prompts
from .diagnostics.plots import plot_bins_vs_k, plot_gradient_diagnostics, plot_training_curves, read_metrics
from .evaluation.benchmarks import Benchmark
from .evaluation.generation import check_sampler
from .recipe import MODEL_RANGES, OFFLINE_MODEL, resolve_model_path
from .tasks import build_task
from .training.callbacks import MetricsJSONLCallback, RewardProgressCallback
from .training.report import write_report
from .utils.cli_errors import MissingPackageError, UserError, user_input
from .utils.hub import HubUnreachableError, check_hub_reachable, check_model_source
from .utils.number_checks import check_numbers
from .utils.run_folder import check_room, staged
from .utils.vllm_check import check_vllm_device


def check_inputs(script_args, training_args, model_args) -> None:
    """Fail before any work on what the parsed config asks for but cannot have: a sampler the evaluation does not
    know, a LoRA number out of its range, a model that is neither a local folder nor a loadable Hub id, vLLM when it
    is not installed or there is no GPU, a push to a Hub that cannot be reached."""
    with user_input(ValueError):
        check_sampler(script_args.eval_sampler, "ACPOScriptArguments.eval_sampler")
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


def run(script_args, training_args, model_args, callbacks=None, stop=None):
    """Build the task and the trainer, train, save; with ``report``, evaluate before/after and write the outputs.

    ``callbacks``: extra ``TrainerCallback`` objects (``script_args.save_final_model=False`` keeps the trained
    weights in memory only: a measurement run). ``stop``: the run's ``StopOnSignal`` (``acpo-train``), added last,
    so that its check at a step's end follows the step's periodic evaluation, which a preemption cuts short.
    Returns the trainer."""
    trainer, task = build_trainer(script_args, training_args, model_args, callbacks)
    evaluator = before = None
    if script_args.report:
        evaluator, before = start_report(trainer, task, script_args, training_args,
                                         abandon=stop.asked if stop is not None else None)
    if stop is not None:
        trainer.add_callback(stop)
    start = time.time()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    wall_s = time.time() - start
    # The report before the model, each written whole or not at all: a full disk then loses the model only.
    if evaluator is not None:
        write_outputs(trainer, evaluator, before, wall_s, script_args, training_args, model_args)
    if script_args.save_final_model:
        with staged(training_args.output_dir, main=trainer.is_world_process_zero()) as folder:
            trainer.save_model(folder, _internal_call=True)  # the push, if any, comes below, from output_dir
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name or script_args.task)
    return trainer


def build_trainer(script_args, training_args, model_args, callbacks=None):
    """``(trainer, task)``: the recipe's task (its data read, long prompts dropped) and an ``ACPOTrainer`` on its
    model, with the run's progress bar; the output folder checked for room once the model is loaded."""
    # deferred: TRL's trainer (and the datasets library with it), which check_inputs does not need
    from trl import get_peft_config, get_quantization_config

    from .trainer import ACPOTrainer

    with user_input(ImportError, FileNotFoundError, FileExistsError):  # the offline model's package and cache
        model_path = resolve_model_path(model_args.model_name_or_path)
    training_args.model_init_kwargs = {  # the recipe's own model_init_kwargs win
        "revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    # Reading the task's data: a missing file, a malformed record or an unreachable Hub dataset is the user's to fix.
    hub_fix = "give a local file, or run once with network access and HF_HUB_OFFLINE unset to cache the dataset"
    with user_input(FileNotFoundError, ValueError, KeyError), user_input(ConnectionError, fix=hub_fix):
        task = build_task(script_args, seed=training_args.seed)
        if script_args.max_prompt_length is not None:
            tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision,
                                                      trust_remote_code=training_args.trust_remote_code)
            task.train_dataset = drop_long_prompts(task.train_dataset, tokenizer, script_args.max_prompt_length)
    trainer = ACPOTrainer(model=model_path, reward_funcs=task.reward_funcs, args=training_args,
                          train_dataset=task.train_dataset, peft_config=get_peft_config(model_args),
                          quantization_config=get_quantization_config(model_args), callbacks=callbacks)
    if script_args.check_disk_space:  # the model is loaded, nothing is trained or evaluated yet
        check_room(trainer, script_args.save_final_model)
    trainer.task_name = script_args.task
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if not training_args.disable_tqdm:
        trainer.add_callback(RewardProgressCallback())
    return trainer, task


def start_report(trainer, task, script_args, training_args, abandon=None):
    """``(evaluator, before)``: the report's held-out evaluation (periodic with ``report_eval_steps``, cut short when
    ``abandon()`` says so) and its before-training result (shared through ``report_before_file``);
    ``metrics.jsonl`` starts with training."""
    from .evaluation.callback import EvalCallback  # deferred: TRL's trainer utilities and the datasets library

    # It starts the file when training begins: a run that fails before leaves an earlier run's file as it was.
    metrics_path = os.path.join(training_args.output_dir, "metrics.jsonl")
    trainer.add_callback(MetricsJSONLCallback(metrics_path, resume=bool(training_args.resume_from_checkpoint)))
    held_out = Benchmark(script_args.task, task.eval_dataset, task.reward_funcs[0])
    evaluator = EvalCallback(trainer, [held_out], eval_steps=script_args.report_eval_steps or 10**9,
                             k=script_args.eval_k, temperature=script_args.eval_temperature,
                             sampler=script_args.eval_sampler, batch_size=script_args.eval_batch_size,
                             seed=training_args.seed, abandon=abandon)
    if script_args.report_eval_steps:
        trainer.add_callback(evaluator)  # logged to metrics.jsonl and report_to as eval/<task>/...
    return evaluator, shared_evaluation(script_args.report_before_file, evaluator.with_counts, trainer.accelerator)


def write_outputs(trainer, evaluator, before: dict, wall_s: float, script_args, training_args, model_args) -> None:
    """After training: the held-out evaluation, then ``eval_before_after.json``, ``training_curves.png``, the
    diagnostics' plots and ``report.md`` in the output folder, each written whole or not at all."""
    after = evaluator.metrics_at(trainer.state.global_step)
    if not trainer.is_world_process_zero():
        return
    entries = read_metrics(os.path.join(training_args.output_dir, "metrics.jsonl"))
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


def shared_evaluation(path: str | None, evaluate, accelerator) -> dict:
    """``evaluate()``, or its result stored at ``path`` by an earlier run; a new result is written there atomically.
    Every process takes the same branch (the main process decides), since ``evaluate`` gathers over processes. Runs
    that share ``path`` and start together evaluate once: the first holds ``<path>.lock`` while it evaluates, and the
    others wait for it, then read its result."""
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
    title = f"{training_args.policy_loss}, {training_args.updates_per_rollout:g} updates per rollout"
    out = [plot_bins_vs_k(entries, os.path.join(folder, "diagnostics_bins.png"), title)]
    if any("grad/angle_deg" in e for e in entries):
        out.append(plot_gradient_diagnostics(entries, os.path.join(folder, "diagnostics_gradient.png"), title))
    return out
