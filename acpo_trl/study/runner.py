"""The grid driver: worker processes run the cells of a grid (testbed runs or recipe runs, each spec runs itself),
two at a time by default, resumable; a worker does not start a cell beside the others' if the peaks measured on
finished cells of the same kind would overfill the memory (:func:`next_spec`).

A run writes ``<out>/runs/<run_id>/``: ``spec.json``, ``metrics.jsonl`` (every training log entry, with the
diagnostics), ``log.txt`` and, LAST, ``result.json`` (written atomically). A run with a ``result.json`` is
finished and skipped, and so is a run packed into ``<out>/runs.jsonl.gz`` (pack.py); any other run directory is rerun
from scratch (a recipe cell with ``save_every`` resumes from its last checkpoint), so an interrupted grid only loses
the runs that were in flight. A preemption, SIGTERM or SIGUSR1 to the grid's process or to all of them (as SLURM
sends it), is passed on to the workers and by them to their ``acpo-train`` cells, which save their step in flight;
no worker starts another run, and the grid exits with 128 + the signal's number (143 after SIGTERM), as
``acpo-train`` does (training/preemption.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from ..training.preemption import PassOn, StopRequested
from .recipe import RecipeRunSpec
from .results import finished_runs, is_done, load_results, read_result
from .testbed import CPU_KERNELS, RunSpec, cpu_kernels, pin_cpu_kernels


def spec_from_json(data: dict) -> "RunSpec | RecipeRunSpec":
    """A queued spec: a recipe cell when it names a recipe, else a testbed run."""
    return RecipeRunSpec.from_json(data) if "recipe" in data else RunSpec.from_json(data)


def _claim(spec: RunSpec, out_dir: Path, session: str) -> bool:
    """Atomically claim ``spec`` for this grid session (claims of earlier, interrupted sessions do not count)."""
    run_dir = out_dir / "runs" / spec.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(run_dir / f".claim-{session}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def memory_budget_gib() -> float:
    """What the cells running side by side may hold together: 90% of this machine's physical memory, in GiB."""
    return 0.9 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1024 ** 3


def measured_memory(out_dir: Path) -> dict:
    """The largest ``peak_rss_gib`` of the finished runs under ``out_dir`` per :attr:`memory_class` (recipe cells;
    a testbed run is small and records none)."""
    peaks = {}
    for result in load_results(out_dir):
        if isinstance(result.get("peak_rss_gib"), (int, float)) and "recipe" in result["spec"]:
            key = spec_from_json(result["spec"]).memory_class
            peaks[key] = max(peaks.get(key, 0.0), result["peak_rss_gib"])
    return peaks


WAIT = "wait"  # what next_spec returns when every claimable cell would overfill the memory


def next_spec(specs: list, out_dir: Path, session: str, budget_gib: float, log=print):
    """Claim the first spec of ``specs`` that is neither finished nor claimed in this grid session and that fits
    in the memory beside the session's runs in flight: the sum of the measured peaks of their memory classes
    (:func:`measured_memory`; an unmeasured class counts 0) stays within ``budget_gib``. A spec runs alone
    whatever it needs. Returns the spec, :data:`WAIT` when only specs that do not fit are left, None when nothing
    is. Workers share ``specs`` and call this under a lock (:func:`work`), so two never claim at once."""
    claimed = {s.run_id for s in specs if (out_dir / "runs" / s.run_id / f".claim-{session}").exists()}
    in_flight = [s for s in specs if s.run_id in claimed and not is_done(s, out_dir)
                 and not (out_dir / "runs" / s.run_id / "error.txt").exists()]
    left = [s for s in specs if s.run_id not in claimed and not is_done(s, out_dir)]
    if not left:
        return None
    peaks = measured_memory(out_dir) if in_flight and any(hasattr(s, "memory_class") for s in left) else {}
    need = lambda s: peaks.get(getattr(s, "memory_class", None), 0.0)  # noqa: E731
    held = sum(need(s) for s in in_flight)
    for spec in left:
        if not in_flight or held + need(spec) <= budget_gib:
            if _claim(spec, out_dir, session):
                (out_dir / "runs" / spec.run_id / "error.txt").unlink(missing_ok=True)
                return spec
    log(f"waiting for memory: {left[0].run_id} needs ~{need(left[0]):.1f} GiB, {held:.1f} of {budget_gib:.1f} GiB "
        f"held by {len(in_flight)} run(s) in flight")
    return WAIT


def work(queue_file: str | Path, out_dir: str | Path, cache_dir: str | Path, session: str, log=print,
         budget_gib: float | None = None, poll_s: float = 30.0) -> None:
    """A worker: run, in this process, the specs of ``queue_file`` that :func:`next_spec` hands it (in order, those
    that fit the memory beside the other workers' runs first; ``budget_gib`` defaults to
    :func:`memory_budget_gib`), waiting ``poll_s`` while none fits. A failing run leaves ``error.txt`` and the
    worker goes on."""
    out_dir = Path(out_dir)
    specs = [spec_from_json(d) for d in json.loads(Path(queue_file).read_text())]
    budget_gib = memory_budget_gib() if budget_gib is None else budget_gib
    waiting = False
    while True:
        with open(Path(queue_file).with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            spec = next_spec(specs, out_dir, session, budget_gib, log=log if not waiting else lambda m: None)
        if spec is None:
            return
        waiting = spec == WAIT
        if waiting:
            time.sleep(poll_s)
            continue
        started = time.time()
        error = out_dir / "runs" / spec.run_id / "error.txt"
        try:
            spec.run(out_dir, cache_dir)
            log(f"{spec.run_id} done in {time.time() - started:.0f} s")
        except StopRequested as stop:
            log(f"{spec.run_id} stopped by {signal.Signals(stop.signum).name} after {time.time() - started:.0f} s")
            raise
        except Exception:  # noqa: BLE001 - one failed run must not stop the grid
            error.write_text(traceback.format_exc())
            log(f"{spec.run_id} FAILED after {time.time() - started:.0f} s (see {error})")


def run_grid(specs: list[RunSpec] | list[RecipeRunSpec], out_dir: str | Path, cache_dir: str | Path, jobs: int = 2,
             log=print) -> list[str]:
    """Run every unfinished spec with ``jobs`` worker processes (one torch thread each, the testbed's CPU kernels
    pinned; each worker runs many runs, so the ~10-30 s import of TRL is paid once per worker, not per run);
    ``jobs=0`` runs them in this process. A warm-up is trained once per distinct :class:`WarmupSpec`, by the first
    run that needs it. Returns the run ids that did not finish (their ``error.txt`` or the worker log says why)."""
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    todo = [s for s in specs if not is_done(s, out_dir)]
    log(f"{len(specs)} runs, {len(specs) - len(todo)} already finished, {len(todo)} to run, {max(jobs, 1)} at a time")
    if todo:
        if jobs == 0 and any(isinstance(s, RunSpec) for s in todo):
            torch.set_num_threads(1)  # two threads on a shared, oversubscribed 2-core machine were slower than one
            if cpu_kernels() != CPU_KERNELS["ATEN_CPU_CAPABILITY"].upper():
                log(f"warning: torch runs {cpu_kernels()} kernels in this process, the study's workers AVX2: these "
                    "runs will not reproduce theirs (use worker processes, or set "
                    + " ".join(f"{k}={v}" for k, v in CPU_KERNELS.items()) + " before importing torch)")
        session = f"{os.getpid()}-{time.time_ns()}"
        work_dir = out_dir / "workers"
        work_dir.mkdir(parents=True, exist_ok=True)
        queue_file = work_dir / f"queue-{session}.json"
        queue_file.write_text(json.dumps([s.to_json() for s in todo]))
        if jobs == 0:
            work(queue_file, out_dir, cache_dir, session, log=log)
        else:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            if any(isinstance(s, RunSpec) for s in todo):  # the testbed: one thread per run, nothing to download
                env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
                pin_cpu_kernels(env)
            else:  # recipe runs: the cores shared out between the workers, unless the caller chose
                env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
            procs = []
            with PassOn() as stop:  # a preemption: the workers stop their cells, then this process stops
                try:
                    for i in range(jobs):
                        if stop.signum:
                            break
                        logfile = open(work_dir / f"worker{i}.log", "a")
                        cmd = [sys.executable, "-m", "acpo_trl.study.cli", "_work", str(queue_file), "--out",
                               str(out_dir), "--cache", str(cache_dir), "--session", session]
                        procs.append((stop.add(subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT,
                                                                env=env)), logfile))
                    reported = set()
                    while any(p.poll() is None for p, _ in procs):
                        time.sleep(2)
                        for spec in todo:
                            if spec.run_id not in reported and is_done(spec, out_dir):
                                reported.add(spec.run_id)
                                log(f"[{len(reported)}/{len(todo)}] {spec.run_id} done")
                finally:
                    for _, logfile in procs:
                        logfile.close()
                if stop.signum:
                    log(f"stopped by {signal.Signals(stop.signum).name}: no other run was started; the same command "
                        "resumes the grid (a recipe cell in flight with save_every from the checkpoint its stop saved, "
                        "any other run in flight from its start)")
        queue_file.unlink(missing_ok=True)
        queue_file.with_suffix(".lock").unlink(missing_ok=True)
    return [s.run_id for s in specs if not is_done(s, out_dir)]


@dataclass(frozen=True)
class TestbedCheck:
    """What :func:`check_reproduces` found: the run it reran, whether it came out bit for bit the same, and the
    digest of the warm-up this machine trains (its testbed, :func:`testbed.weights_digest`)."""

    run_id: str
    reproduced: bool
    warmup_digest: str
    stored_digest: str | None  # the warm-up the stored run started from (None: not recorded)
    message: str


def check_reproduces(specs: list, out_dir: str | Path, cache_dir: str | Path, log=print) -> TestbedCheck | None:
    """Before a grid resumes on this machine: rerun its shortest finished testbed run (in a worker, as the grid
    would) and compare its held-out evaluations and rollout rewards with the stored ones, bit for bit. None when
    nothing is finished yet. A testbed run is chaotic, and the warm-up every run starts from depends on how the
    machine's kernels round, so a machine that does not reproduce the finished runs is another testbed."""
    out_dir = Path(out_dir)
    done = [s for s in specs if isinstance(s, RunSpec) and is_done(s, out_dir)]
    if not done:
        return None
    spec = min(done, key=lambda s: (s.steps * max(s.upr, 1), s.run_id))
    stored = read_result(out_dir, spec.run_id)
    log(f"checking that this machine reproduces {spec.run_id} ({spec.steps} steps) before resuming")
    with tempfile.TemporaryDirectory() as tmp:
        if run_grid([spec], tmp, cache_dir, jobs=1, log=lambda m: None):
            log_text = (Path(tmp) / "workers" / "worker0.log").read_text()[-2000:]
            raise RuntimeError(f"{spec.run_id} failed to rerun here:\n{log_text}")
        rerun = json.loads((Path(tmp) / "runs" / spec.run_id / "result.json").read_text())
    reproduced = rerun["evals"] == stored["evals"] and rerun["rewards"] == stored["rewards"]
    message = f"{spec.run_id} reproduced bit for bit" if reproduced else (
        f"{spec.run_id} does not reproduce here: held-out accuracy {stored['start_sampled']:.4f} -> "
        f"{stored['final_sampled']:.4f} stored, {rerun['start_sampled']:.4f} -> {rerun['final_sampled']:.4f} rerun "
        f"with {rerun.get('cpu_kernels', '?')} kernels (warm-up {rerun['warmup_digest']})")
    return TestbedCheck(spec.run_id, reproduced, rerun["warmup_digest"], stored.get("warmup_digest"), message)


def block(spec) -> tuple[str, int]:
    """A block of the grid: one group (task, drift level) and one seed. Within a block the variants and regimes
    are compared run for run, so a block's runs must all come from one testbed."""
    return spec.group, spec.seed


def open_blocks(specs: list, out_dir: str | Path, warmup_digest: str) -> tuple[list, list[tuple[str, int]]]:
    """For a machine that does not reproduce the finished runs: (the specs it may run, the blocks it must leave).
    It may run the blocks that have no finished run yet and those whose finished runs all started from its own
    warm-up (``warmup_digest``; a run finished before warm-ups were recorded counts as another testbed's)."""
    finished = finished_runs(out_dir)
    closed = {block(spec) for spec in specs
              if spec.run_id in finished and finished[spec.run_id].get("warmup_digest") != warmup_digest}
    return [s for s in specs if block(s) not in closed], sorted(closed)
