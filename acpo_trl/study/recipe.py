"""The study on a real model: each cell of the grid is one ``acpo-train`` run of a recipe YAML.

    acpo-study run --recipe configs/study/qwen2.5-0.5b-instruct_countdown.yaml --out study_gpu/ \\
        --methods acpo dapo cispo --uprs 2 8 16 --seeds 3 --jobs 1
    acpo-study run --real-model          the committed SmolLM2 grid (configs/study/smollm2_addition.yaml, CPU)

A cell changes only what the study varies, on the command line of ``acpo-train``: ``--policy_loss``, the regime
(updates per rollout), ``--seed``, ``--acpo_alpha`` / ``--acpo_clip_min`` / ``--acpo_clip_max`` for ACPO's
variants, ``--learning_rate`` for a drift level, ``--output_dir`` (the run's folder), and switches on the report
(held-out avg@k before, every ``eval_steps`` and after training) and the diagnostics. Everything else (model, task,
batch, vLLM, ...) is the recipe's. Two ways to set the regime:

- ``rollout`` None: ``--steps_per_generation`` = updates per rollout x the recipe's accumulation, the mini-batch
  being the recipe's (a higher regime samples more completions per rollout);
- ``rollout`` N (the paper's regimes): every regime samples N completions per rollout, for ``rollouts`` rollouts,
  and the mini-batch is N / updates per rollout, so runs of one seed sample as many completions and see the same
  prompts whatever the regime.

The before-training evaluation is the same for every cell of a seed (same model, held-out set and sampling seed):
the first cell to need it writes ``<out>/before/<task>/seed<seed>.json`` and the others read it. A recipe that starts
from a local checkpoint (a warm-up) keys it by the checkpoint's digest, ``<out>/before/<task>/<digest>/seed<seed>.json``,
and each run records that digest (``warmup_digest``): a warm-up trained again on a CPU that rounds differently is
another start, evaluated on its own, and the table lists the runs of each start. The run's
``metrics.jsonl`` and ``eval_before_after.json`` become the same ``result.json`` as a testbed run, so ``acpo-study
report`` writes the same table and plots.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from ..evaluation.generation import check_sampler
from ..evaluation.metrics import CORRECT
from ..recipe import make_parser
from ..training.preemption import PassOn
from ..utils.cli_errors import parse_config, user_input
from .cell import GridCell
from .results import code_version, write_result

# "python" runs as this interpreter (sys.executable); the spec and result keep the word, not the machine's path.
DEFAULT_LAUNCHER = ("python", "-m", "acpo_trl.train")


@dataclass(frozen=True)
class RecipeRunSpec(GridCell):
    """One cell of a recipe study: ``recipe`` (an ``acpo-train`` YAML) with the study's overrides."""

    recipe: str
    method: str = "acpo"
    upr: int = 2  # optimizer updates per rollout
    seed: int = 0
    alpha: float | None = None
    clip: tuple[float, float] | None = None
    steps: int | None = None  # None: the recipe's max_steps (or rollouts x upr with `rollout`)
    eval_steps: int = 50  # held-out evaluation every N optimizer steps (plus before and after training)
    last_evals: int = 3
    grad_every: int = 10  # gradient diagnostics every N optimizer steps (0: off)
    launcher: tuple[str, ...] = field(default=DEFAULT_LAUNCHER)
    lr: float | None = None  # None: the recipe's learning_rate; else a drift level, named in the group
    rollout: int | None = None  # completions per rollout, the same in every regime (None: the recipe's mini-batch)
    rollouts: int | None = None  # with `rollout`: rollouts per run (max_steps = rollouts x upr)
    options: tuple[tuple[str, object], ...] = ()  # other ACPOConfig fields of the variant, e.g. (("epsilon", 0.43),)
    save_every: int = 0  # a checkpoint every N optimizer steps, from which a cut-short run resumes (0: none)
    keep_model: bool = False  # keep the trained model in <out>/models/<run_id>/ (from the last checkpoint)

    def __post_init__(self):
        config = self.config
        if not isinstance(config, dict) or "model_name_or_path" not in config:
            raise ValueError(f"--recipe {self.recipe}: not an acpo-train recipe (no `model_name_or_path`).")
        if self.rollout is not None:
            accumulation = int(config.get("gradient_accumulation_steps", 1))
            if self.rollouts is None or self.steps is not None:
                raise ValueError("RecipeRunSpec: with `rollout`, give the run's length as `rollouts` (not `steps`).")
            if self.rollout % (self.upr * accumulation) or self.rollout % int(config.get("num_generations", 8)):
                raise ValueError(f"RecipeRunSpec.rollout={self.rollout}: must split into {self.upr} updates x "
                                 f"{accumulation} accumulation steps and into groups of num_generations.")
        elif self.steps is None and not config.get("max_steps"):
            raise ValueError(f"--recipe {self.recipe}: set `max_steps` in the recipe or pass --steps.")
        if self.keep_model and (not self.save_every or self.num_steps % self.save_every):
            raise ValueError(f"RecipeRunSpec.keep_model: the model is the run's last checkpoint; give a save_every that "
                             f"divides the run's {self.num_steps} steps.")

    @property
    def config(self) -> dict:
        return yaml.safe_load(Path(self.recipe).read_text())

    @property
    def task(self) -> str:
        """The table's task label: the recipe's file name."""
        return Path(self.recipe).stem

    @property
    def group(self) -> str:
        """The table section: the recipe, with the learning rate when the cell sets one (a drift level)."""
        return self.task if self.lr is None else f"{self.task}@lr{self.lr:g}"

    @property
    def memory_class(self) -> tuple:
        """Cells that need about the same memory: one recipe, regime and rollout size (the mini-batch follows)."""
        return self.recipe, self.upr, self.rollout

    @property
    def num_steps(self) -> int:
        if self.rollout is not None:
            return self.rollouts * self.upr
        return self.steps or int(self.config["max_steps"])

    def to_json(self) -> dict:
        # "steps" is the trained length (the collapse rule and the table read it); the override is "steps_arg"
        data = {**asdict(self), "launcher": list(self.launcher), "task": self.task, "steps_arg": self.steps}
        data["steps"] = self.num_steps
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RecipeRunSpec":
        data = {k: v for k, v in data.items() if k not in ("task", "steps")}
        data["steps"] = data.pop("steps_arg")
        data["launcher"] = tuple(data["launcher"])
        if data.get("clip") is not None:
            data["clip"] = tuple(data["clip"])
        data["options"] = tuple((name, tuple(value) if isinstance(value, list) else value)
                                for name, value in data.get("options", ()))
        return cls(**data)

    @cached_property
    def start_digest(self) -> str | None:
        """:func:`checkpoint_digest` of the model the recipe starts from (None for a Hub name or ``offline:``); read
        once per cell (the start file and the result both name it, and a warm-up's weights are ~0.5 GB to hash)."""
        return checkpoint_digest(self.config["model_name_or_path"])

    def before_file(self, out_dir: str | Path) -> Path:
        """Where the cells of this recipe, start and seed share their before-training evaluation."""
        return Path(out_dir) / "before" / self.task / (self.start_digest or "") / f"seed{self.seed}.json"

    def command(self, run_dir: Path, before_file: Path | None = None) -> list[str]:
        """The ``acpo-train`` command line of this cell."""
        accumulation = int(self.config.get("gradient_accumulation_steps", 1))
        args = [
            "--config", self.recipe, "--output_dir", str(run_dir), "--policy_loss", self.policy_loss,
            "--steps_per_generation", str(self.upr * accumulation), "--seed", str(self.seed),
            "--report", "true", "--report_eval_steps", str(self.eval_steps), "--logging_steps", "1",
            "--diagnostics", "true", "--diagnostics_grad_every", str(self.grad_every),
            "--save_final_model", "false", "--push_to_hub", "false",
        ]
        if self.save_every:  # only the latest checkpoint is kept; the runner deletes it once the run is done
            args += ["--save_strategy", "steps", "--save_steps", str(self.save_every), "--save_total_limit", "1"]
        else:
            args += ["--save_strategy", "no"]
        if self.rollout is not None:
            args += ["--per_device_train_batch_size", str(self.rollout // (self.upr * accumulation))]
        if self.steps is not None or self.rollout is not None:
            args += ["--max_steps", str(self.num_steps)]
        if self.lr is not None:
            args += ["--learning_rate", f"{self.lr:g}"]
        if before_file is not None:
            args += ["--report_before_file", str(before_file)]
        for name, value in self.config_overrides().items():
            args += [f"--{name}", *(map(str, value) if isinstance(value, (list, tuple)) else [str(value)])]
        return [*self.launcher, *args]

    def check(self) -> None:
        """Parse this cell's ``acpo-train`` arguments as ``acpo-train`` does: a mistake in the recipe (a NaN, a
        negative learning rate, an unknown field, a sampler the evaluation does not know) fails once, in one line,
        before the grid starts."""
        script_args, _, _ = parse_config(make_parser(), self.command(Path("check"))[len(self.launcher):])
        with user_input(ValueError):
            check_sampler(script_args.eval_sampler, "ACPOScriptArguments.eval_sampler")

    def run(self, out_dir: str | Path, cache_dir: str | Path | None = None) -> dict:
        """Run this cell (``acpo-train`` in a child process, output in ``log.txt``) and write its ``result.json``.
        With ``save_every``, a run that an earlier attempt left with a checkpoint resumes from it (the trainer's
        resume is exact; ``metrics.jsonl`` keeps the entries up to the checkpoint) and its ``seconds`` add the
        earlier attempts' time up to their last checkpoint. ``peak_rss_gib``: the peak resident memory of the
        ``acpo-train`` process that finished the run, from which the grid's workers schedule the cells of the same
        :attr:`memory_class` (runner.py). (``cache_dir`` is the testbed's warm-up cache: unused.)"""
        run_dir = Path(out_dir) / "runs" / self.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = latest_checkpoint(run_dir) if self.save_every else None
        stale = ["result.json", "error.txt", "eval_before_after.json"] + ([] if checkpoint else ["metrics.jsonl"])
        for name in stale:
            (run_dir / name).unlink(missing_ok=True)
        (run_dir / "spec.json").write_text(json.dumps(self.to_json(), indent=1))
        earlier = _earlier_attempts(run_dir, checkpoint)
        command = self.command(_relative(run_dir), _relative(self.before_file(out_dir)))
        if checkpoint is not None:
            command += ["--resume_from_checkpoint", str(_relative(checkpoint))]
        start, code_at_start = time.time(), code_version()
        (run_dir / ATTEMPTS).write_text(json.dumps({**earlier, "attempt_start": start}))
        with open(run_dir / "log.txt", "a" if checkpoint else "w") as log:
            log.write(shlex.join(command) + "\n")
            log.flush()
            code, peak_gib = call_measuring_memory(_this_python(command), stdout=log)
        if code != 0:
            tail = (run_dir / "log.txt").read_text()[-3000:]
            raise RuntimeError(f"{self.run_id}: acpo-train exited with {code}:\n{tail}")
        result = write_result(self, run_dir, read_evals(run_dir, self.num_steps), start - earlier["seconds"],
                              code_at_start, command=shlex.join(command), peak_rss_gib=peak_gib,
                              **read_correct(run_dir),
                              **({"warmup_digest": self.start_digest} if self.start_digest else {}),
                              **({"resumed_at": earlier["resumed_at"]} if earlier["resumed_at"] else {}))
        final = run_dir / f"checkpoint-{self.num_steps}"
        if self.keep_model:
            keep_weights(final, Path(out_dir) / "models" / self.run_id)
        for done in run_dir.glob("checkpoint-*"):
            shutil.rmtree(done)
        (run_dir / ATTEMPTS).unlink()
        return result


ATTEMPTS = "attempts.json"  # a run's earlier attempts: their time up to their last checkpoint, the steps resumed at
# What of a checkpoint the trainer needs to resume and a model does not: left behind when the model is kept.
TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin", "rng_state*.pth",
                  "rollout_state_*.pt", "README.md")


def keep_weights(checkpoint: Path, target: Path) -> None:
    """Move the model of ``checkpoint`` (weights, config, tokenizer: a folder ``from_pretrained`` loads) to
    ``target``, leaving the training state behind."""
    if not (checkpoint / "config.json").is_file():
        raise RuntimeError(f"{checkpoint}: no model to keep (the run saved no checkpoint at its last step).")
    skipped = {path for pattern in TRAINING_STATE for path in checkpoint.glob(pattern)}
    target.mkdir(parents=True, exist_ok=True)
    for path in checkpoint.iterdir():
        if path.is_file() and path not in skipped:
            shutil.move(str(path), target / path.name)


def call_measuring_memory(command: list[str], stdout) -> tuple[int, float]:
    """Run ``command`` to its end: (its exit status, the peak resident memory of its process in GiB). The peak is
    ``wait4``'s ``ru_maxrss`` for that process alone (not this one's other children), which Linux starts at this
    process's resident memory at the fork: the larger of the two, exact for a cell that outgrows its worker.

    A preemption (SIGTERM or SIGUSR1 to this process while the command runs) is passed on to the command, which
    ``acpo-train`` answers by saving a checkpoint of its step in flight; once the command has ended, this raises
    :class:`StopRequested` (exit status 128 + the signal's number) instead of returning, so that a grid starts no
    other cell."""
    with PassOn() as stop:
        process = stop.add(subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT))
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:
            process.kill()
            process.wait()
            raise
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped: no signal is sent on to its pid after this
    return process.returncode, usage.ru_maxrss / 1024 ** 2  # ru_maxrss is in KiB on Linux


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's last complete checkpoint (``checkpoint-N`` with its trainer state), or None."""
    done = [d for d in run_dir.glob("checkpoint-*") if (d / "trainer_state.json").is_file()]
    return max(done, key=lambda d: int(d.name.split("-")[-1]), default=None)


def _earlier_attempts(run_dir: Path, checkpoint: Path | None) -> dict:
    """``{"seconds", "resumed_at"}`` of the attempts before this one: without a checkpoint none count; with one,
    the last attempt counts up to the time its checkpoint was written (the work after it is done again)."""
    path = run_dir / ATTEMPTS
    if checkpoint is None or not path.is_file():
        return {"seconds": 0.0, "resumed_at": []}
    earlier = json.loads(path.read_text())
    saved = (checkpoint / "trainer_state.json").stat().st_mtime
    return {"seconds": earlier["seconds"] + max(saved - earlier["attempt_start"], 0.0),
            "resumed_at": [*earlier["resumed_at"], int(checkpoint.name.split("-")[-1])]}


def checkpoint_digest(path: str) -> str | None:
    """The first 12 hex digits of the sha256 of a local checkpoint's weight files (``*.safetensors``, in name
    order), or None where ``path`` is no such folder. The same warm-up command gives another checkpoint on a CPU
    whose kernels round differently (docs/RESULTS.md, "Reproducibility"): the digest tells the starts apart."""
    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()[:12]


def _this_python(command: list[str]) -> list[str]:
    """The command with a leading ``python`` run as this interpreter (the one the study runs in)."""
    return [sys.executable, *command[1:]] if command[:1] == ["python"] else command


def _relative(path: Path) -> Path:
    """``path`` relative to the working directory when it lies under it: a recorded command names no machine path."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def _eval_keys(metrics: dict) -> dict[str, str]:
    """The report's held-out metrics that a result keeps: ``sampled`` (avg@k), ``pass`` (pass@k), ``truncation``."""
    keys = {}
    for name, marker in (("sampled", "/avg@"), ("pass", "/pass@"), ("truncation", "/truncation_rate")):
        found = [k for k in metrics if k.startswith("eval/") and marker in k and not k.startswith("eval/macro/")]
        if len(found) != 1:
            raise RuntimeError(f"expected one held-out {marker.strip('/@')} metric in the report, found {sorted(metrics)}")
        keys[name] = found[0]
    return keys


def read_correct(run_dir: Path) -> dict:
    """``{"correct": {"before": [...], "after": [...]}}``: the held-out set's correct samples per problem before and
    after training, from an ``acpo-train --report`` output folder (empty for a run whose report has none)."""
    before_after = json.loads((run_dir / "eval_before_after.json").read_text())
    counts = {when: next(iter((before_after[when].get(CORRECT) or {}).values()), None) for when in ("before", "after")}
    return {"correct": counts} if all(value is not None for value in counts.values()) else {}


def read_evals(run_dir: Path, steps: int) -> list[dict]:
    """Held-out avg@k (``sampled``), pass@k and truncation rate over training from an ``acpo-train --report``
    output folder: before training (step 0), every ``eval_steps`` (``metrics.jsonl``) and after training (step
    ``steps``)."""
    before_after = json.loads((run_dir / "eval_before_after.json").read_text())
    keys = _eval_keys(before_after["after"])
    evals = {0: before_after["before"], steps: before_after["after"]}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        entry = json.loads(line) if line.strip() else {}
        if isinstance(entry.get(keys["sampled"]), (int, float)) and entry["step"] not in evals:
            evals[entry["step"]] = entry
    return [{"step": step, **{name: metrics[key] for name, key in keys.items()}} for step, metrics in sorted(evals.items())]


def recipe_grid(recipe: str, methods, uprs, seeds, alphas, steps: int | None = None, eval_steps: int = 50,
                grad_every: int = 10, launcher: tuple[str, ...] = DEFAULT_LAUNCHER) -> list[RecipeRunSpec]:
    """methods x uprs x seeds, plus ACPO at each alpha of ``alphas``; seed-major like the testbed grid."""
    base = dict(recipe=str(recipe), steps=steps, eval_steps=eval_steps, grad_every=grad_every, launcher=launcher)
    specs = []
    for seed in seeds:
        for upr in uprs:
            specs += [RecipeRunSpec(method=m, upr=upr, seed=seed, **base) for m in methods]
            specs += [RecipeRunSpec(method="acpo", upr=upr, seed=seed, alpha=a, **base) for a in alphas]
    return specs
