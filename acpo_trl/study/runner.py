"""One study run (one process), and the grid driver (two runs at a time, resumable).

A run writes ``<out>/runs/<run_id>/``: ``spec.json``, ``metrics.jsonl`` (every training log entry, with the
diagnostics), ``log.txt`` and, LAST, ``result.json`` (written atomically). A run with a ``result.json`` is
finished and skipped; any other run directory is rerun from scratch, so an interrupted grid only loses the runs
that were in flight.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .cell import DEFAULT_LR, GridCell
from .recipe import RecipeRunSpec, run_recipe
from .testbed import WarmupSpec, evaluate, load_warm_model, rl_dataset, task_problems, warm_up


@dataclass(frozen=True)
class RunSpec(GridCell):
    """One RL run of the study (the testbed's RL settings by default)."""

    task: str = "add1"
    method: str = "acpo"
    upr: int = 2  # optimizer updates per rollout = steps_per_generation (gradient accumulation 1)
    seed: int = 0
    alpha: float | None = None  # ACPO's alpha; None: the ACPOConfig default (3.0)
    clip: tuple[float, float] | None = None  # ACPO's [eps_min, eps_max]; None: the ACPOConfig default [0, 3]
    steps: int = 200
    lr: float = DEFAULT_LR
    batch_size: int = 64  # completions per optimizer step
    num_generations: int = 8
    max_new_tokens: int = 16
    eval_every: int = 40
    eval_k: int = 8
    last_evals: int = 3  # "mean of the last evaluations" averages this many
    grad_every: int = 10  # gradient diagnostics once per N optimizer steps (0: off)
    warmup: WarmupSpec = field(default_factory=WarmupSpec)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunSpec":
        data = dict(data)
        data["warmup"] = WarmupSpec(**data["warmup"])
        if data.get("clip") is not None:
            data["clip"] = tuple(data["clip"])
        return cls(**data)


def collapsed(rewards: list[tuple[int, float]], steps: int, tail: float = 0.2) -> bool:
    """True when the rollout reward fell to 0 and stayed there: every rollout of the last ``tail`` of the run
    (at least two rollouts) has reward 0."""
    last = [r for s, r in rewards if s > (1 - tail) * steps]
    return len(last) >= 2 and all(r == 0 for r in last)


def run_one(spec: RunSpec, out_dir: str | Path, cache_dir: str | Path) -> dict:
    """Train one run in this process and write its files (see the module docstring). Returns the result."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    from ..callbacks import MetricsJSONLCallback
    from ..config import ACPOConfig
    from ..diagnostics import DiagnosticsConfig, attach_diagnostics
    from ..trainer import ACPOTrainer
    from .testbed import addition_reward

    run_dir = Path(out_dir) / "runs" / spec.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "result.json", "error.txt"):
        (run_dir / stale).unlink(missing_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json(), indent=1))
    start = time.time()
    model, tokenizer = load_warm_model(warm_up(spec.warmup, cache_dir))
    train, held = task_problems(spec.task)
    args = ACPOConfig(
        output_dir=str(run_dir), report_to="none", use_cpu=True, bf16=False, seed=spec.seed, data_seed=spec.seed,
        per_device_train_batch_size=spec.batch_size, num_generations=spec.num_generations,
        steps_per_generation=spec.upr, gradient_accumulation_steps=1, max_completion_length=spec.max_new_tokens,
        temperature=1.0, top_p=1.0, learning_rate=spec.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.01, max_grad_norm=1.0, beta=0.0, loss_type="grpo", max_steps=spec.steps, logging_steps=1,
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, policy_loss=spec.method,
        gradient_checkpointing=False,  # TRL's GRPO default is True: a recomputed forward, for nothing at this size
        **spec.config_overrides(),
    )
    evals: list[dict] = []

    class Evaluate(TrainerCallback):
        def _run(self, step):
            evals.append({"step": step, **evaluate(model, tokenizer, held, k=spec.eval_k,
                                                   max_new_tokens=spec.max_new_tokens, seed=1000 + spec.seed)})

        def on_train_begin(self, args, state, control, **kwargs):
            self._run(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % spec.eval_every == 0 or state.global_step == spec.steps:
                self._run(state.global_step)

    # A rollout takes batch_size * upr / num_generations prompts (128 at upr 16) and TRL drops an incomplete last
    # batch: with add1's 70 prompts and no repetition, upr 16 would train for 0 steps. Repeat the prompt list, the
    # same number of times in every regime (sized for upr 16), so that all regimes sample prompts alike.
    prompts_per_rollout = spec.batch_size * max(spec.upr, 16) // spec.num_generations
    repeats = max(1, math.ceil(4 * prompts_per_rollout / len(train)))
    trainer = ACPOTrainer(model, addition_reward, args=args, train_dataset=rl_dataset(train * repeats),
                          processing_class=tokenizer,
                          callbacks=[MetricsJSONLCallback(str(run_dir / "metrics.jsonl")), Evaluate()])
    trainer.remove_callback(PrinterCallback)  # the log entries go to metrics.jsonl, not to stdout
    attach_diagnostics(trainer, DiagnosticsConfig(ratio_stats=True, grad_every=spec.grad_every))
    trainer.train()
    if trainer.state.global_step != spec.steps:
        raise RuntimeError(f"{spec.run_id}: trained {trainer.state.global_step} of {spec.steps} steps.")
    return write_result(spec, run_dir, evals, start, torch_threads=torch.get_num_threads())


def write_result(spec, run_dir: Path, evals: list[dict], start: float, **extra) -> dict:
    """Summarize a finished run (its ``metrics.jsonl`` and held-out ``evals``: ``{"step", "sampled", ...}`` from
    step 0 to the end) into ``result.json``, written last and atomically; returns the result. Shared by the
    testbed runs and the recipe runs (:mod:`.recipe`), so that one table reads both."""
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [(e["step"], e["reward"]) for e in entries if isinstance(e.get("reward"), (int, float))]
    last = evals[-spec.last_evals:]
    angles = [e["grad/angle_deg"] for e in entries if isinstance(e.get("grad/angle_deg"), (int, float))]
    result = {
        "diagnostics": summarize_diagnostics(entries),
        "spec": spec.to_json(),
        "run_id": spec.run_id,
        "group": spec.group,
        "variant": spec.variant,
        "final_sampled": evals[-1]["sampled"],
        "final_greedy": evals[-1].get("greedy"),
        "last_evals_mean": sum(e["sampled"] for e in last) / len(last),
        "start_sampled": evals[0]["sampled"],
        "collapsed": collapsed(rewards, evals[-1]["step"]),
        "mean_angle_deg": sum(angles) / len(angles) if angles else None,
        "evals": evals,
        "rewards": rewards,
        "seconds": time.time() - start,
        **extra,
    }
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, run_dir / "result.json")
    return result


def summarize_diagnostics(entries: list[dict]) -> dict:
    """Run means of the diagnostics, small enough for ``result.json`` (so tables and cross-seed plots do not need
    ``metrics.jsonl``): ``bins[metric]["k,b"]``, ``grad_k[metric]["k"]`` and ``grad[metric]`` (shares, angle)."""
    from ..diagnostics.plots import bin_table

    bins = {name: {f"{k},{b}": v for (k, b), v in cells.items()} for name, cells in bin_table(entries).items()}
    sums: dict = {}
    for entry in entries:
        for key, value in entry.items():
            if key.startswith("grad/") and isinstance(value, (int, float)) and math.isfinite(value):
                sums.setdefault(key, []).append(value)
    means = {key: sum(v) / len(v) for key, v in sums.items()}
    grad_k: dict = {}
    for key, value in means.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[1].startswith("k"):
            grad_k.setdefault(parts[2], {})[parts[1][1:]] = value
    return {"bins": bins, "grad_k": grad_k,
            "grad": {k[5:]: v for k, v in means.items() if not k.split("/")[1].startswith("k")}}


def spec_from_json(data: dict) -> "RunSpec | RecipeRunSpec":
    """A queued spec: a recipe cell when it names a recipe, else a testbed run."""
    return RecipeRunSpec.from_json(data) if "recipe" in data else RunSpec.from_json(data)


def is_done(spec: RunSpec, out_dir: str | Path) -> bool:
    return (Path(out_dir) / "runs" / spec.run_id / "result.json").exists()


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
            if isinstance(spec, RunSpec):
                run_one(spec, out_dir, cache_dir)
            else:
                run_recipe(spec, out_dir)
            log(f"{spec.run_id} done in {time.time() - started:.0f} s")
        except Exception:  # noqa: BLE001 - one failed run must not stop the grid
            error.write_text(traceback.format_exc())
            log(f"{spec.run_id} FAILED after {time.time() - started:.0f} s (see {error})")


def run_grid(specs: list[RunSpec] | list[RecipeRunSpec], out_dir: str | Path, cache_dir: str | Path, jobs: int = 2,
             log=print) -> list[str]:
    """Run every unfinished spec with ``jobs`` worker processes (one torch thread each; each worker runs many
    runs, so the ~10-30 s import of TRL is paid once per worker, not per run); ``jobs=0`` runs them in this
    process. Warm-ups are trained first, once per distinct :class:`WarmupSpec`. Returns the run ids that did not
    finish (their ``error.txt`` or the worker log says why)."""
    import torch

    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    todo = [s for s in specs if not is_done(s, out_dir)]
    log(f"{len(specs)} runs, {len(specs) - len(todo)} already finished, {len(todo)} to run, {max(jobs, 1)} at a time")
    if todo:
        if any(isinstance(s, RunSpec) for s in todo):
            torch.set_num_threads(1)  # two threads on a shared, oversubscribed 2-core machine were slower than one
        for warm in sorted({s.warmup for s in todo if isinstance(s, RunSpec)}, key=lambda w: w.key()):
            warm_up(warm, cache_dir, log=log)
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


# ---------------------------------------------------------------------------------------------------------------
# Grids

PAPER_METHODS = ("acpo", "ppo_clip", "dapo", "cispo", "high_entropy", "low_entropy", "ar_lopti")
UPRS = (2, 8, 16)
ALPHAS = (0.5, 1.0)  # plus the default 3.0, which is the main grid's ACPO


def build_grid(
    tasks=("add1", "add2"),
    methods=None,
    uprs=UPRS,
    seeds=range(8),
    alphas=ALPHAS,
    base: RunSpec | None = None,
    warmups: dict[str, WarmupSpec] | None = None,
) -> list[RunSpec]:
    """methods x uprs x seeds per task, plus ACPO at each alpha of ``alphas`` x uprs x seeds (the alpha sweep:
    with ACPO's default 3.0 from the main grid it is {0.5, 1, 3}). ``methods`` defaults to every registered
    policy loss. Ordered seed-major, so a partial grid has whole seeds."""
    from ..losses import POLICY_LOSSES

    base = base or RunSpec()
    methods = tuple(methods) if methods else tuple(sorted(POLICY_LOSSES))
    specs = []
    for seed in seeds:
        for task in tasks:
            warm = (warmups or {}).get(task, replace(base.warmup, task=task))
            for upr in uprs:
                for method in methods:
                    specs.append(replace(base, task=task, method=method, upr=upr, seed=seed, alpha=None, warmup=warm))
                for alpha in alphas:
                    specs.append(replace(base, task=task, method="acpo", upr=upr, seed=seed, alpha=alpha, warmup=warm))
    return specs


def quick_grid(out_steps: int = 4) -> list[RunSpec]:
    """The test suite's grid: 2 methods x 2 regimes x 1 seed on add1 plus one alpha, a 40-step warm-up, a few RL
    steps with small rollouts."""
    warm = WarmupSpec(task="add1", steps=30, hidden_size=32, batch_size=32, warmup_steps=5)
    base = RunSpec(steps=out_steps, batch_size=16, num_generations=4, max_new_tokens=12, eval_every=2, eval_k=2,
                   last_evals=2, grad_every=2, lr=5e-4, warmup=warm)
    return build_grid(tasks=("add1",), methods=("acpo", "dapo"), uprs=(1, 2), seeds=(0,), alphas=(1.0,), base=base,
                      warmups={"add1": warm})


@dataclass(frozen=True)
class DriftLevel:
    """A drift level of the drift grid: the testbed's learning rate, and enough steps for every level to learn."""

    name: str
    lr: float
    steps: int


# Off-policy drift is set by the learning rate (with Adam the policy moves ~lr per optimizer update). "matched": the
# bin-0 ratio std at the last update of a 16-update rollout within 2x of SmolLM2-135M's at the paper's lr 1e-6
# (calibrated on 3 rollouts: 0.19-0.21 at lr 1e-5, the edge of that band, so half of it); "between": the geometric
# middle; "extreme": the committed grid. Steps grow as lr falls, by less than 1/lr: a low lr learns far more per
# unit of lr x steps (rollout reward +0.08 in 135 steps at 1e-5 against +0.2 in 200 at 5e-4); docs/RESULTS.md.
DRIFT_LEVELS = (
    DriftLevel("extreme", DEFAULT_LR, 200),
    DriftLevel("between", 5e-5, 400),
    DriftLevel("matched", 5e-6, 1600),
)
# (method, alpha, clip): ACPO (the paper's), ACPO with the authors' public defaults, acpo_log, DAPO, CISPO. ACPO
# alpha 0.5 and the fixed clip were dropped to keep the grid near 8 hours of the machine (`acpo-study plan --drift`
# printed 9.3 h with them); the committed grid has them at the extreme level.
DRIFT_VARIANTS = (
    ("acpo", None, None),
    ("acpo", 1.0, (0.05, 0.5)),
    ("acpo_log", None, None),
    ("dapo", None, None),
    ("cispo", None, None),
)


def drift_grid(
    tasks=("add2",),
    levels=DRIFT_LEVELS,
    variants=DRIFT_VARIANTS,
    uprs=(2, 16),
    seeds=range(8),
) -> list[RunSpec]:
    """variants x uprs x seeds at each drift level (seed-major, so a partial grid has whole seeds). A level's runs
    evaluate 5 times and diagnose the gradient 20 times whatever their length (the committed grid's 40 / 10 at 200
    steps), so a long run costs no more per step than a short one. The extreme level's cells are the committed
    grid's runs (same run ids)."""
    specs = []
    for seed in seeds:
        for level in levels:
            base = RunSpec(lr=level.lr, steps=level.steps, eval_every=level.steps // 5, grad_every=level.steps // 20)
            for task in tasks:
                for upr in uprs:
                    for method, alpha, clip in variants:
                        specs.append(replace(base, task=task, method=method, upr=upr, seed=seed, alpha=alpha,
                                             clip=clip, warmup=replace(base.warmup, task=task)))
    return specs


def estimate_seconds(specs: list[RunSpec], seconds_per_step: dict[int, float], jobs: int = 2) -> float:
    """Wall time of ``specs`` at ``seconds_per_step[upr]`` (measured per optimizer step, one thread), ``jobs`` at a time."""
    total = sum(s.steps * seconds_per_step.get(s.upr, max(seconds_per_step.values())) for s in specs)
    return total / jobs if math.isfinite(total) else total
