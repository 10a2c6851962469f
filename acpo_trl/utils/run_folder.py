"""A run's output folder: one run at a time.

One run per folder (:func:`claimed`): while it runs, a run holds ``<folder>/.acpo-lock`` (JSON: host, pid, command,
start time), which appears whole (a hard link of a written file: atomic on local and network file systems) and is
removed when the run ends, by an exception too. A second run into the folder is refused in one line naming the first.
A lock whose process is gone (this host, and its pid runs no process, or a later one) is taken over with a log line;
one written on another host cannot be checked, so the refusal names the file to delete if that run is gone. Under
``accelerate launch`` only the main process locks, and every process takes its decision.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .cli_errors import UserError

logger = logging.getLogger(__name__)

LOCK = ".acpo-lock"


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
    own.write_text(json.dumps(record))
    try:
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
        from accelerate.utils import broadcast_object_list

        message = [str(refusal) if refusal is not None else None]
        broadcast_object_list(message)
        if message[0] is None:
            return
        state.destroy_process_group()
        if not state.is_main_process:
            raise SystemExit(2)
    if refusal is not None:
        raise refusal
