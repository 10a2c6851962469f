"""Trainer callbacks of ``acpo-train``: a metrics JSONL file and a progress bar that shows reward and clip ranges."""

from __future__ import annotations

import json
import math
import os

from transformers import ProgressCallback, TrainerCallback


class MetricsJSONLCallback(TrainerCallback):
    """Write every log entry (``{"step": ..., **logs}``) as one JSON line to ``path`` (main process only).

    The file is started afresh when training begins, not before: a run that fails earlier (loading the model, the
    evaluation before training, building the optimizer) leaves an earlier run's file as it was. With ``resume``
    (a run resumed from a checkpoint) the file keeps its entries up to the checkpoint's step (those logged after it,
    by the attempt that was cut short, are logged again) and the new ones are appended."""

    def __init__(self, path: str, resume: bool = False):
        self.path = path
        self.resume = resume

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            kept = []
            if self.resume and os.path.isfile(self.path):
                with open(self.path, encoding="utf-8") as f:
                    kept = [line for line in f if (step := _step(line)) is not None and step <= state.global_step]
            with open(self.path, "w", encoding="utf-8") as f:
                f.writelines(kept)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in logs.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": state.global_step, **clean}) + "\n")


def _step(line: str) -> int | None:
    """The step of a ``metrics.jsonl`` line; None for a line torn by a killed process."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None


class RewardProgressCallback(ProgressCallback):
    """transformers' progress bar, with the latest reward, ACPO bin ranges and, with the drift guard on, the updates
    taken in the current rollout and the rollouts cut short as its postfix instead of printed log dictionaries."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        postfix = {}
        if logs.get("reward") is not None:
            postfix["reward"] = f"{logs['reward']:.3f}"
        eps = [logs[k] for k in sorted(logs) if k.startswith("acpo/bin") and k.endswith("/eps") and logs[k] is not None]
        if eps:
            postfix["eps"] = "/".join(f"{e:.2f}" for e in eps)
        if logs.get("drift_guard/updates_in_rollout") is not None:
            postfix["updates/rollout"] = f"{logs['drift_guard/updates_in_rollout']:.0f}/{args.updates_per_rollout:g}"
            postfix["cut"] = f"{logs['drift_guard/rollouts_cut']:.0f}"
        if postfix:
            self.training_bar.set_postfix(postfix, refresh=False)
