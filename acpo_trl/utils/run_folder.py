"""A run's output folder: one run at a time, room for what the run writes, and no half-written file.

One run per folder (:func:`claimed`): while it runs, a run holds ``<folder>/.acpo-lock`` (JSON: host, pid, command,
start time), which appears whole (a hard link of a written file: atomic on local and network file systems) and is
removed when the run ends, by an exception too. A second run into the folder is refused in one line naming the first.
A lock whose process is gone (this host, and its pid runs no process, or a later one) is taken over with a log line;
one written on another host cannot be checked, so the refusal names the file to delete if that run is gone. Under
``accelerate launch`` only the main process locks, and every process takes its decision.

Room (:func:`check_room`): a training run whose output folder's disk cannot hold what it will write
(:func:`planned_bytes`) is refused before it trains.

No half-written file: :func:`staged` writes into a folder inside the output folder and moves each file into place once
all are written; :func:`whole_or_removed` removes a folder written in place (a checkpoint) whose writing failed. Both
turn a failed write into :class:`WriteFailed`, one line naming the file and the errno.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import math
import os
import re
import shlex
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .cli_errors import UserError

logger = logging.getLogger(__name__)

LOCK = ".acpo-lock"
STAGING = ".acpo-staging"
FULL = 1 << 20  # bytes: a disk left with less than this after a failed write is full (torch.save names no errno)
WRITE_FIX = ("make room on that disk and run again; with --resume_from_checkpoint true, acpo-train resumes from its "
             "last checkpoint")


class WriteFailed(UserError):
    """A write into a run's folder failed (e.g. a full disk): names the file and the errno."""


@contextmanager
def claimed(folder: str | os.PathLike, prog: str, field: str = "output_dir", state=None):
    """Hold ``folder`` for this run while the block runs (module docstring); ``field`` is the setting that names it.
    ``state``: accelerate's ``PartialState`` of a launch, whose main process locks, or None for one process."""
    lock = Path(folder) / LOCK
    record = refusal = None
    if state is None or state.is_main_process:
        os.makedirs(folder, exist_ok=True)
        record = {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid()),
                  "command": shlex.join([prog, *sys.argv[1:]]), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        holder = _acquire(lock, record)
        if holder is not None:
            where = f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
            fix = f"wait for it to end, or give another {field}"
            if holder.get("host") != record["host"]:
                fix += f"; if it is no longer running, delete {lock}"
            refusal = UserError(f"{folder} is in use by another run: {holder.get('command')} ({where})", fix)
    _agree(refusal, state)
    try:
        yield
    finally:
        if record is not None and _read(lock) == record:  # not a lock another run took over by hand
            lock.unlink()


def _acquire(lock: Path, record: dict) -> dict | None:
    """Create ``lock`` holding ``record``, taking over a stale one; None, or the record of the run holding it."""
    own = lock.with_name(f"{LOCK}.{os.getpid()}")
    try:
        own.write_text(json.dumps(record))
        while True:
            try:
                os.link(own, lock)
                return None
            except FileExistsError:
                holder = _read(lock)
            if holder is None:  # released between the two calls
                continue
            if _running(holder):
                return holder
            if _move_away(lock, holder):
                logger.warning("%s: taking the folder over from a run that is gone (pid %s on %s, started %s: %s)",
                               lock.parent, holder.get("pid"), holder.get("host"), holder.get("started"),
                               holder.get("command"))
    finally:
        own.unlink(missing_ok=True)


def _read(lock: Path) -> dict | None:
    """The lock's record; None when there is no lock, {} when it is not one this module wrote."""
    try:
        record = json.loads(lock.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _running(holder: dict) -> bool:
    """Whether the run that wrote ``holder`` may still run: any run of another host (it cannot be checked); on this
    host, a live process with its pid that started when it did (a pid is given again once its process is gone)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    return holder.get("start") in (None, _process_start(pid))


def _process_start(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (Linux: field 22 of /proc/<pid>/stat); None elsewhere."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _move_away(lock: Path, holder: dict) -> bool:
    """Remove the stale ``lock`` that holds ``holder``, unless another run took it over first (what this moved is
    then that run's lock, put back)."""
    moved = lock.with_name(f"{LOCK}.stale.{os.getpid()}")
    try:
        os.rename(lock, moved)
    except FileNotFoundError:
        return False
    try:
        if _read(moved) == holder:
            return True
        try:
            os.link(moved, lock)
        except FileExistsError:
            pass
        return False
    finally:
        moved.unlink(missing_ok=True)


def _agree(refusal: UserError | None, state) -> None:
    """Every process of a launch takes the main process's decision: the main one raises ``refusal``, the others
    leave with its status 2 (one line per launch, not one per process), the process group ended first (an exit
    after a collective with the group alive can abort on gloo: docs/recipes.md, "Multi-node")."""
    if state is not None and state.num_processes > 1:
        from accelerate.utils import broadcast_object_list  # deferred: accelerate and torch, for a multi-process launch

        message = [str(refusal) if refusal is not None else None]
        broadcast_object_list(message)
        if message[0] is None:
            return
        state.destroy_process_group()
        if not state.is_main_process:
            raise SystemExit(2)
    if refusal is not None:
        raise refusal


def planned_bytes(trainer, save_final_model: bool) -> tuple[int, str]:
    """What a training run adds to its output folder at most, and how it adds up: the final model (the weights it
    trains, in their dtype; with LoRA the adapter) and the checkpoints on disk at once, each the model plus, unless
    ``save_only_model``, the optimizer's state (AdamW: two float32 moments per trainable parameter; DeepSpeed also
    keeps float32 master weights). The checkpoints: those the schedule saves, less those already in the folder (a
    resumed run's; a save at the same step replaces one), and with ``save_total_limit`` at most one more than the
    limit allows (a new one is written before the oldest is deleted)."""
    args = trainer.args
    params = list(trainer.model.parameters())
    trainable = [p for p in params if p.requires_grad]
    weights = _bytes(trainable if getattr(trainer.model, "peft_config", None) else params)
    per_param = 12 if getattr(trainer, "is_deepspeed_enabled", False) else 8
    checkpoint = weights + (0 if args.save_only_model else per_param * _numel(trainable))
    saves = _saves(trainer)
    existing = len(glob.glob(os.path.join(glob.escape(args.output_dir), "checkpoint-*")))
    new = max(saves - existing, min(saves, 1))
    if args.save_total_limit:
        new = min(new, max(args.save_total_limit + 1 - existing, 1))
    final = weights if save_final_model else 0
    parts = [f"the final model of {_size(final)}"] if final else []
    if new:
        optimizer = "" if args.save_only_model else ", with the optimizer state"
        parts.append(f"{new} checkpoint{'s' if new > 1 else ''} of {_size(checkpoint)}{' each' * (new > 1)}{optimizer}")
    return final + new * checkpoint, " and ".join(parts) or "nothing"


def _numel(params) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) for p in params)  # ds_numel: a ZeRO-3 partitioned weight's own


def _bytes(params) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in params)


def _saves(trainer) -> int:
    """The checkpoints the schedule saves: every ``save_steps`` steps and at the last one, at each epoch's end, or
    (``best``) at least one."""
    args = trainer.args
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    if strategy in ("no", "best"):
        return int(strategy == "best")
    per_epoch = _steps_per_epoch(trainer) if args.max_steps <= 0 or strategy == "epoch" else 0
    steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch)
    if strategy == "epoch":
        return math.ceil(steps / per_epoch)
    every = args.save_steps if args.save_steps >= 1 else math.ceil(steps * args.save_steps)
    return math.ceil(steps / every)


def _steps_per_epoch(trainer) -> int:
    """Optimizer steps per pass over the prompts, as TRL's sampler makes them: each rollout of
    ``generation_batch_size`` completions (``num_generations`` per prompt) feeds ``steps_per_generation`` x
    ``num_iterations`` micro-steps, ``gradient_accumulation_steps`` of them per optimizer step."""
    args = trainer.args
    rollouts = len(trainer.train_dataset) // (args.generation_batch_size // args.num_generations)
    return max(rollouts * args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps, 1)


def check_room(trainer, save_final_model: bool) -> None:
    """Refuse, in one line, a training run whose output folder's disk has less free space than
    :func:`planned_bytes`."""
    args = trainer.args
    refusal = None
    if trainer.accelerator.is_main_process:
        need, parts = planned_bytes(trainer, save_final_model)
        free = shutil.disk_usage(_existing(args.output_dir)).free
        if need > free:
            refusal = UserError(f"output_dir {args.output_dir} has {_size(free)} free, and this run writes "
                                f"{_size(need)} there ({parts})", "make room there, give another output_dir, or "
                                "set check_disk_space: false to go on")
    _agree(refusal, args.distributed_state)


def _existing(path: str) -> str:
    """``path``, or its nearest folder that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


@contextmanager
def staged(folder: str, main: bool = True):
    """Yield a folder to write into; when the block ends, move each thing it holds into ``folder`` (one rename each:
    a file appears whole, and an earlier run's stays until its replacement is whole). If the block fails nothing it
    wrote is left, and a failed write is raised as ``WriteFailed``. ``main``: whether this process writes (on the
    others, e.g. the ranks of a model save that gathers weights, the block only runs)."""
    stage = os.path.join(folder, STAGING)
    if main:
        shutil.rmtree(stage, ignore_errors=True)  # left by a run killed while writing
        os.makedirs(stage)
    try:
        yield stage
        if main:
            for name in sorted(os.listdir(stage)):
                target = os.path.join(folder, name)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                os.replace(os.path.join(stage, name), target)
    except BaseException as error:
        failure = _write_failure(error, stage, shown=folder) if main else None
        if failure is None:
            raise
        raise failure from error
    finally:
        if main:
            shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def whole_or_removed(folder: str):
    """For a folder written in place (a checkpoint): if the block fails, remove the folder, so that no resume starts
    from part of it; a failed write is raised as ``WriteFailed``."""
    try:
        yield
    except BaseException as error:
        failure = _write_failure(error, folder)
        shutil.rmtree(folder, ignore_errors=True)
        if failure is None:
            raise
        raise failure from error


def _write_failure(error: BaseException, folder: str, shown: str | None = None) -> WriteFailed | None:
    """``error``, raised while writing into ``folder`` (shown as ``shown``), as a ``WriteFailed`` naming the file and
    the errno; None when it is not a failed write. The errno: an ``OSError``'s, or the "os error N" of safetensors'
    message; torch.save gives neither, so a disk it left with less than ``FULL`` free counts as full (ENOSPC). The
    file: the ``OSError``'s, else the innermost frame of the traceback holding a path inside ``folder`` (the writer's
    own argument: neither library names it)."""
    if not isinstance(error, Exception):
        return None
    code = _errno(error)
    if code is None and shutil.disk_usage(_existing(folder)).free < FULL:
        code = errno.ENOSPC
    if code is None:
        return None
    path = os.path.relpath(_file_in(error, folder) or folder, folder)
    return WriteFailed(f"writing {os.path.normpath(os.path.join(shown or folder, path))} failed: [Errno {code}] "
                       f"{os.strerror(code)}", WRITE_FIX)


def _errno(error: BaseException | None) -> int | None:
    while error is not None:
        if isinstance(error, OSError) and error.errno:
            return error.errno
        if found := re.search(r"\(os error (\d+)\)", str(error)):
            return int(found.group(1))
        error = error.__cause__ or error.__context__
    return None


def _file_in(error: BaseException, folder: str) -> str | None:
    if isinstance(error, OSError) and error.filename:
        return os.fspath(error.filename)
    root = os.path.abspath(folder) + os.sep
    frames = []
    trace = error.__traceback__
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, (str, Path)):
                path = os.path.abspath(value)
                if path.startswith(root) and not os.path.isdir(path):
                    return path
    return None
