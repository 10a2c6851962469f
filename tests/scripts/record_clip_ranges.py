"""Test helper: run ``examples/train_acpo.py`` (the ``acpo-train`` code path) under ``accelerate launch`` and record,
on every rank, what ACPO's loss computed at each micro-step.

    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml tests/scripts/record_clip_ranges.py \\
        OUT_DIR --config recipe_a.yaml [--config recipe_b.yaml ...]

Each ``--config`` is trained in turn, in the same processes (imports and the process group are paid once). For
each recipe, rank r writes ``OUT_DIR/<recipe stem>.rank<r>.json`` with one record per call of ACPO's
``BinClipRule.stats`` made by ACPO's loss (the per-bin count, std and eps the loss used, plus the eps that *local*
statistics would have given on the same micro-batch, with that micro-batch's count, mean and std; the diagnostics'
own calls are not recorded), the per-token loss of that micro-batch (masked mean, this rank's tokens), the process
layout, how many weights each gradient diagnosis had to gather under ZeRO-3 (``zero3_gathered``), the optimizer
steps that moved the weights and the drift guard's state, the trainer's log history, and how many times
``acpo-train``'s end asked to destroy the process group (``end_training_calls``; the call itself waits for the
last recipe, which still needs the group). Nothing in ``acpo_trl`` is changed: ``BinClipRule.stats``, which ``acpo_loss``
calls, the ``acpo`` registry entry, the diagnostics' ZeRO-3 gathering and ``Accelerator.end_training`` are wrapped for
the duration of the run.

Environment: ``ACPO_TEST_NO_DS_SHM_OP=1`` skips the JIT build of DeepSpeed's (unused) shared-memory kernel;
``ACPO_TEST_ZERO3_RELEASE_AFTER_USE=1`` makes ZeRO-3 release every weight after each use.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import runpy
import sys
from pathlib import Path

from process_exit import exit_now

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_acpo.py"


def _floats(tensor) -> list[float]:
    return [float(v) for v in tensor.detach().double().cpu().reshape(-1).tolist()]


def _optimizer_steps(trainer) -> int:
    """The optimizer steps that moved the weights: DeepSpeed's engine counter, else AdamW's per-parameter step."""
    if hasattr(trainer.model_wrapped, "global_steps"):
        return int(trainer.model_wrapped.global_steps)
    return max((int(s["step"]) for s in trainer.optimizer.state.values() if "step" in s), default=0)


def main() -> None:
    out_dir = Path(sys.argv[1])
    configs = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "--config"]
    extra = [a for i, a in enumerate(sys.argv[2:], 2) if a != "--config" and sys.argv[i - 1] != "--config"]

    import acpo_trl.diagnostics.gradients as gradients_module
    import acpo_trl.train as train_module
    from acpo_trl.losses import POLICY_LOSSES, BinClipRule

    original_stats = BinClipRule.stats
    original_entry = POLICY_LOSSES["acpo"]
    original_run = train_module.run
    original_gathered = gradients_module._zero3_gathered
    records: list[dict] = []
    gathered: list[int] = []
    finished: list = []

    ended: list = []  # the accelerators whose end_training acpo-train's main called (the process group's end)
    in_loss: list[bool] = [False]  # only ACPO's loss is recorded, not the diagnostics' own use of the bin rule

    def recording_stats(rule, bins, x, all_reduce=None):
        stats = original_stats(rule, bins, x, all_reduce)
        if not in_loss[0]:
            return stats
        record = {"scope": "global" if all_reduce is not None else "local",
                  "count": _floats(stats.count), "std": _floats(stats.std), "eps": _floats(stats.eps)}
        if all_reduce is not None:  # what "local" statistics would give on this same micro-batch
            local = original_stats(rule, bins, x, None)
            record.update(local_count=_floats(local.count), local_mean=_floats(local.mean),
                          local_std=_floats(local.std), local_eps=_floats(local.eps))
        records.append(record)
        return stats

    def recording_loss(inputs, config):
        in_loss[0] = True
        try:
            output = original_entry.fn(inputs, config)
        finally:
            in_loss[0] = False
        mask = inputs.mask
        loss = float((output.per_token_loss.detach() * mask).sum() / mask.sum().clamp(min=1))
        records[-1]["loss"] = loss  # the BinClipRule.stats record of this very call
        records[-1]["tokens"] = float(mask.sum())
        return output

    def recording_run(*args, **kwargs):
        trainer = original_run(*args, **kwargs)
        finished.append(trainer)
        return trainer

    if os.environ.get("ACPO_TEST_NO_DS_SHM_OP") == "1":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce kernel (minutes on a loaded machine)
        # that only its inference all-reduce uses; training communicates through torch.distributed (gloo).
        # (`import deepspeed.comm.torch as m` would bind the real torch: deepspeed.comm re-exports it.)
        ds_comm_torch = importlib.import_module("deepspeed.comm.torch")
        ds_comm_torch.build_shm_op = lambda: None
    if os.environ.get("ACPO_TEST_ZERO3_RELEASE_AFTER_USE") == "1":
        import deepspeed

        original_initialize = deepspeed.initialize

        def initialize(*args, **kwargs):  # accelerate looks deepspeed.initialize up when it prepares the model
            # ZeRO-3 releases a weight after each use when its next use is farther than this (in elements); with the
            # default (1e9) a tiny model stays gathered from its forward to its backward, a large one does not.
            kwargs["config_params"]["zero_optimization"]["stage3_max_reuse_distance"] = 0
            return original_initialize(*args, **kwargs)

        deepspeed.initialize = initialize

    def counting_gathered(model, offload):  # how many weights the gradient diagnostics had to gather
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        gathered.append(sum(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in model.parameters()))
        return original_gathered(model, offload)

    def deferred_end(accelerator):  # the next recipe trains in the same process group: end it after the last one
        ended.append(accelerator)

    from accelerate import Accelerator

    original_end = Accelerator.end_training
    Accelerator.end_training = deferred_end
    gradients_module._zero3_gathered = counting_gathered
    BinClipRule.stats = recording_stats
    POLICY_LOSSES["acpo"] = dataclasses.replace(original_entry, fn=recording_loss)
    train_module.run = recording_run  # examples/train_acpo.py -> acpo_trl.train.main -> run
    try:
        for config in configs:
            records.clear()
            finished.clear()
            gathered.clear()
            ended.clear()
            sys.argv = [str(EXAMPLE), "--config", config, *extra]
            runpy.run_path(str(EXAMPLE), run_name="__main__")
            trainer = finished[-1]
            state = trainer.accelerator.state
            result = {
                "config": config,
                "process_index": state.process_index,
                "num_processes": state.num_processes,
                "distributed_type": str(state.distributed_type),
                "backend": state.backend,
                "device": str(trainer.accelerator.device),
                "global_step": trainer.state.global_step,
                "engine": type(trainer.model_wrapped).__name__,
                "zero_stage": (trainer.model_wrapped.zero_optimization_stage()
                               if hasattr(trainer.model_wrapped, "zero_optimization_stage") else None),
                "optimizer": type(getattr(trainer.model_wrapped, "optimizer", None) or trainer.optimizer).__name__,
                "optimizer_steps": _optimizer_steps(trainer),
                "drift_guard": trainer.drift_guard.to_dict() if trainer.drift_guard is not None else None,
                "records": records,
                "zero3_gathered": gathered,
                "end_training_calls": len(ended),
                "log_history": [{k: v for k, v in e.items() if isinstance(v, (int, float)) and math.isfinite(v)}
                                for e in trainer.state.log_history],
            }
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{Path(config).stem}.rank{state.process_index}.json"
            path.write_text(json.dumps(result))
            trainer.accelerator.wait_for_everyone()
        original_end(trainer.accelerator)  # acpo-train's end, once, after the last recipe
    finally:
        Accelerator.end_training = original_end
        BinClipRule.stats = original_stats
        POLICY_LOSSES["acpo"] = original_entry
        train_module.run = original_run
        gradients_module._zero3_gathered = original_gathered


if __name__ == "__main__":
    main()
    exit_now()  # not through the finalization, where gloo can abort the process (process_exit.py)
