"""The grid driver: worker processes run the cells of a grid (testbed runs or recipe runs, each spec runs itself),
two at a time by default, resumable.

A run writes ``<out>/runs/<run_id>/``: ``spec.json``, ``metrics.jsonl`` (every training log entry, with the
diagnostics), ``log.txt`` and, LAST, ``result.json`` (written atomically). A run with a ``result.json`` is
finished and skipped; any other run directory is rerun from scratch, so an interrupted grid only loses the runs
that were in flight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .recipe import RecipeRunSpec
from .results import is_done
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


def work(queue_file: str | Path, out_dir: str | Path, cache_dir: str | Path, session: str, log=print) -> None:
    """A worker: run, in this process and in order, every spec of ``queue_file`` that is neither finished nor
    claimed by another worker of the session. A failing run leaves ``error.txt`` and the worker goes on."""
    import traceback

    out_dir = Path(out_dir)
    specs = [spec_from_json(d) for d in json.loads(Path(queue_file).read_text())]
    for spec in specs:
        if is_done(spec, out_dir) or not _claim(spec, out_dir, session):
            continue
        started = time.time()
        error = out_dir / "runs" / spec.run_id / "error.txt"
        error.unlink(missing_ok=True)
        try:
            spec.run(out_dir, cache_dir)
            log(f"{spec.run_id} done in {time.time() - started:.0f} s")
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
            import torch

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
            for i in range(jobs):
                logfile = open(work_dir / f"worker{i}.log", "a")
                cmd = [sys.executable, "-m", "acpo_trl.study.cli", "_work", str(queue_file), "--out", str(out_dir),
                       "--cache", str(cache_dir), "--session", session]
                procs.append((subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env), logfile))
            reported = set()
            while any(p.poll() is None for p, _ in procs):
                time.sleep(2)
                for spec in todo:
                    if spec.run_id not in reported and is_done(spec, out_dir):
                        reported.add(spec.run_id)
                        log(f"[{len(reported)}/{len(todo)}] {spec.run_id} done")
            for _, logfile in procs:
                logfile.close()
        queue_file.unlink(missing_ok=True)
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
    import tempfile

    out_dir = Path(out_dir)
    done = [s for s in specs if isinstance(s, RunSpec) and is_done(s, out_dir)]
    if not done:
        return None
    spec = min(done, key=lambda s: (s.steps * max(s.upr, 1), s.run_id))
    stored = json.loads((out_dir / "runs" / spec.run_id / "result.json").read_text())
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
    out_dir = Path(out_dir)
    closed = set()
    for spec in specs:
        if is_done(spec, out_dir):
            result = json.loads((out_dir / "runs" / spec.run_id / "result.json").read_text())
            if result.get("warmup_digest") != warmup_digest:
                closed.add(block(spec))
    return [s for s in specs if block(s) not in closed], sorted(closed)
