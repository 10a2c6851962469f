"""Real multi-process training on CPU, launched with ``accelerate launch`` as a user would:

- DDP over gloo (``configs/accelerate/cpu_2proc.yaml``): with ``acpo_stats_scope: global`` both ranks use the
  same per-bin clip ranges at every micro-step (and they are the ranges of the pooled batch); with ``local``
  they differ.
- DeepSpeed ZeRO-2 on CPU (``configs/accelerate/deepspeed_zero2_cpu.yaml``): the same run trains under a ZeRO-2
  engine, the ranks agree, and the clip ranges, losses and diagnostics match the DDP run's.
- DeepSpeed ZeRO-3 on CPU (``configs/accelerate/deepspeed_zero3_cpu.yaml``): the same run, with its weights
  partitioned, saves a checkpoint at step 2 and a second run resumes from it; the ranks agree, the clip ranges,
  losses and diagnostics (gradient diagnostics included) match the DDP run's, and the resumed run's match the
  uninterrupted one's.

The DDP, ZeRO-2 and ZeRO-3 runs of the ``global`` recipe have every diagnostic on (ratio statistics every micro-step,
gradient diagnostics every step). DeepSpeed runs are compared with DDP to ``DEEPSPEED_TOL``: float32 on CPU, same
data and seed, but ZeRO reduces (ZeRO-3: reduce-scatters) the gradients in another order than DDP's all-reduce, so the
trajectories agree to rounding (measured, ZeRO-3: at most 3.3e-7 on the losses, 4.8e-7 on eps, 2e-6 on the training
gradient's norm, 5.1e-6 on the diagnostics; ZeRO-2: 6e-8, 2.4e-7, 1.3e-6, 1.4e-6).

Each launch runs ``tests/scripts/record_clip_ranges.py``, which executes ``examples/train_acpo.py`` (the
``acpo-train`` code path) and writes, per rank, what ACPO's loss computed at each micro-step.

- Metrics across processes: with every diagnostic on and one rank's advantages all zero (a zero gradient there),
  both ranks still emit the same metric names, train to the end and log the same keys
  (``tests/scripts/train_zero_advantage_rank.py``).
- A preemption: SIGTERM to the launcher and to rank 1 (as SLURM signals every process of a job step; rank 0 gets only
  the launcher's forwarded copy) mid-run: both ranks save one checkpoint of the same step, the launcher exits 143,
  and the command the main process prints ends with the weights of the DDP launch's uninterrupted run and its every
  periodic evaluation once (``tests/scripts/train_and_exit.py``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RECORDER = REPO / "tests" / "scripts" / "record_clip_ranges.py"
ZERO_ADVANTAGE_RANK = REPO / "tests" / "scripts" / "train_zero_advantage_rank.py"
TRAIN_AND_EXIT = REPO / "tests" / "scripts" / "train_and_exit.py"
DDP_CONFIG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
ZERO2_CPU_CONFIG = REPO / "configs" / "accelerate" / "deepspeed_zero2_cpu.yaml"
ZERO3_CPU_CONFIG = REPO / "configs" / "accelerate" / "deepspeed_zero3_cpu.yaml"
LAUNCH_TIMEOUT_S = 300
DIAGNOSTICS = {"diagnostics": True, "diagnostics_grad_every": 1}  # every diagnostic, every step
# DeepSpeed on CPU: no `use_cpu` (accelerate disables DeepSpeed for a cpu state) and an explicit gloo backend (see
# the comments of the accelerate configs). The recorder skips the JIT build of DeepSpeed's shared-memory inference
# all-reduce kernel, which training does not use.
DEEPSPEED_ARGS = ("--use_cpu", "false", "--ddp_backend", "gloo")
DEEPSPEED_ENV = {"DS_ACCELERATOR": "cpu", "ACPO_TEST_NO_DS_SHM_OP": "1"}
DEEPSPEED_TOL = 1e-4  # DeepSpeed vs DDP (module docstring): float32 on CPU, another gradient reduction order
LOGGED_PREFIXES = ("acpo/", "diag/", "grad/", "clip_ratio/")
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason='deepspeed is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation "deepspeed==0.19.8" '
           "after torch, as .ci/run does (docs/distributed_and_notebook.md)")
MICRO_STEPS = 4  # max_steps 4 x gradient_accumulation_steps 1
# The drift guard at a threshold below any drift, with 2 micro-batches per update and 3 updates per rollout: every
# rollout applies its first update (r = 1: k3 = 0) and is cut at its second; 2 rollouts in 6 steps.
GUARD = {"drift_guard": "kl", "drift_guard_threshold": 1e-12, "gradient_accumulation_steps": 2,
         "steps_per_generation": 6, "max_steps": 6}
BASE, ALPHA, EPS_MIN, EPS_MAX, STD_EPS = 0.2, 3.0, 0.0, 3.0, 1e-8
# 10 steps of 4 updates per rollout, with the report: a stop after most steps is a stop within a rollout. A periodic
# evaluation every 2 steps over shards of 3 and 2 problems, one per batch: the ranks ask whether to cut it short after
# the same number of batches (2), or they would hang on a collective.
PREEMPT = {"max_steps": 10, "steps_per_generation": 4, "report": True, "eval_k": 2, "report_eval_steps": 2,
           "num_eval_tasks": 5, "eval_batch_size": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_recipe(directory: Path, model_dir: str, name: str, **overrides) -> Path:
    """A tiny off-policy ACPO recipe: 2 optimizer updates per rollout, 4 steps, 4 completions per process."""
    recipe = {
        "model_name_or_path": model_dir, "task": "toy", "num_train_tasks": 64, "num_eval_tasks": 4,
        "output_dir": str(directory / f"out_{name}"), "use_cpu": True, "bf16": False, "seed": 0,
        "per_device_train_batch_size": 4, "num_generations": 4, "steps_per_generation": 2,
        "gradient_accumulation_steps": 1, "max_completion_length": 8, "learning_rate": 0.01,
        "max_steps": 4, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
        "policy_loss": "acpo", "acpo_num_bins": 5, "acpo_alpha": ALPHA, "epsilon": BASE,
        "acpo_clip_min": EPS_MIN, "acpo_clip_max": EPS_MAX, "acpo_stats_scope": "global",
    }
    recipe.update(overrides)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def launch(config_file: Path, out_dir: Path, recipes: list[Path], *extra: str, env: dict | None = None,
           script: Path = RECORDER) -> None:
    """``accelerate launch`` ``script`` (the recorder: on ``recipes``, trained one after the other in the same
    processes)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
           "--main_process_port", str(free_port()), str(script), str(out_dir)]
    for recipe in recipes:
        cmd += ["--config", str(recipe)]
    cmd += list(extra)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                **(env or {})}
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"accelerate launch did not finish in {LAUNCH_TIMEOUT_S} s:\n{(error.stderr or '')[-4000:]}")
    assert proc.returncode == 0, f"accelerate launch failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"


def load_ranks(out_dir: Path, name: str) -> list[dict]:
    ranks = [json.loads((out_dir / f"{name}.rank{r}.json").read_text()) for r in range(2)]
    assert [r["process_index"] for r in ranks] == [0, 1]
    assert all(r["num_processes"] == 2 for r in ranks)
    assert all(r["end_training_calls"] == 1 for r in ranks)  # acpo-train destroys its process group at its end
    return ranks


def check_completed(ranks: list[dict], model_dir: Path, first_step: int = 0) -> None:
    """Every rank ran the 4 steps (from ``first_step`` when resumed) with finite losses, and the trained model was
    saved."""
    for rank in ranks:
        assert rank["global_step"] == MICRO_STEPS
        assert len(rank["records"]) == MICRO_STEPS - first_step
        assert all(math.isfinite(r["loss"]) and r["tokens"] > 0 for r in rank["records"])
        logged = [e["policy_loss"] for e in rank["log_history"] if "policy_loss" in e]
        assert len(logged) == MICRO_STEPS and all(math.isfinite(v) for v in logged)
    assert (model_dir / "model.safetensors").stat().st_size > 0
    assert (model_dir / "config.json").exists()


def logged(rank: dict) -> dict[int, dict[str, float]]:
    """The trainer's metrics per step: the loss, the norm of the training gradient, ACPO's per-bin statistics and
    every diagnostic."""
    return {e["step"]: {k: v for k, v in e.items()
                        if k.startswith(LOGGED_PREFIXES) or k in ("loss", "policy_loss", "grad_norm")}
            for e in rank["log_history"] if "policy_loss" in e}


def check_ranks_agree(ranks: list[dict]) -> None:
    """Both ranks used the same per-bin clip ranges at every micro-step, bit for bit, and logged the same metrics."""
    for step, (r0, r1) in enumerate(zip(*(r["records"] for r in ranks))):
        assert r0["eps"] == r1["eps"], f"micro-step {step}: rank 0 {r0['eps']} != rank 1 {r1['eps']}"
    assert logged(ranks[0]) == logged(ranks[1])


def check_matches_ddp(ranks: list[dict], ddp: list[dict], first_step: int = 0) -> None:
    """Same data and seed as the DDP run: the same clip ranges and losses at every micro-step (from ``first_step``)
    and the same logged metrics, diagnostics included, at every step, to DEEPSPEED_TOL."""
    for rank, ddp_rank in zip(ranks, ddp):
        for step, (r, d) in enumerate(zip(rank["records"], ddp_rank["records"][first_step:]), first_step):
            assert r["eps"] == pytest.approx(d["eps"], abs=DEEPSPEED_TOL), f"micro-step {step}"
            assert r["loss"] == pytest.approx(d["loss"], abs=DEEPSPEED_TOL), f"micro-step {step}"
        ours, theirs = logged(rank), logged(ddp_rank)
        assert sorted(ours) == sorted(theirs) == list(range(1, MICRO_STEPS + 1))
        for step in ours:
            assert sorted(ours[step]) == sorted(theirs[step]), f"step {step}: not the same metrics"
            for name, value in ours[step].items():
                assert value == pytest.approx(theirs[step][name], rel=DEEPSPEED_TOL, abs=DEEPSPEED_TOL), (step, name)
    names = set().union(*map(set, logged(ranks[0]).values()))
    assert {"grad/angle_deg", "grad/norm_used", "grad/share/bin0/pos", "diag/k1/bin0/ratio_std",
            "acpo/bin0/eps", "grad_norm"} <= names


def same_weights(a: Path, b: Path) -> bool:
    """Whether two runs saved the same final weights, bit for bit."""
    from safetensors.torch import load_file

    ours, theirs = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return sorted(ours) == sorted(theirs) and all(ours[k].equal(theirs[k]) for k in ours)


def pooled_eps(records: list[dict]) -> list[float]:
    """eps_b from the ranks' own per-bin count / mean / std pooled into one batch (population variance)."""
    eps = []
    for b in range(len(records[0]["local_count"])):
        counts = [r["local_count"][b] for r in records]
        n = sum(counts)
        if n == 0:
            eps.append(min(max(BASE, EPS_MIN), EPS_MAX))
            continue
        means = [r["local_mean"][b] for r in records]
        variances = [r["local_std"][b] ** 2 - STD_EPS if c > 0 else 0.0 for r, c in zip(records, counts)]
        mean = sum(c * m for c, m in zip(counts, means)) / n
        var = sum(c * (v + (m - mean) ** 2) for c, v, m in zip(counts, variances, means)) / n
        eps.append(min(max(BASE + ALPHA * math.sqrt(max(var, 0.0) + STD_EPS), EPS_MIN), EPS_MAX))
    return eps


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory, tiny_dir):
    """One 2-process DDP launch training the global-statistics recipe (every diagnostic on), then the local one."""
    work = tmp_path_factory.mktemp("ddp")
    recipes = [write_recipe(work, tiny_dir, "global", **DIAGNOSTICS),
               write_recipe(work, tiny_dir, "local", acpo_stats_scope="local"),
               write_recipe(work, tiny_dir, "guard", **GUARD), write_recipe(work, tiny_dir, "preempt", **PREEMPT)]
    launch(DDP_CONFIG, work / "records", recipes)
    return work


@pytest.mark.slow
def test_ddp_two_processes_global_clip_ranges_agree_across_ranks(ddp_runs):
    ranks = load_ranks(ddp_runs / "records", "global")
    assert all(r["backend"] == "gloo" and r["distributed_type"] == "DistributedType.MULTI_CPU" for r in ranks)
    check_completed(ranks, ddp_runs / "out_global")
    local_differs = False
    for step, (r0, r1) in enumerate(zip(*(r["records"] for r in ranks))):
        assert r0["scope"] == r1["scope"] == "global"
        # The same ranges on both ranks, bit for bit, from the statistics of the pooled batch.
        assert r0["eps"] == r1["eps"], f"micro-step {step}: rank 0 {r0['eps']} != rank 1 {r1['eps']}"
        assert r0["count"] == r1["count"] == [a + b for a, b in zip(r0["local_count"], r1["local_count"])]
        assert r0["eps"] == pytest.approx(pooled_eps([r0, r1]), abs=1e-6)
        # The two ranks train on different completions, so their own ("local") ranges are not the same.
        local_differs |= r0["local_eps"] != r1["local_eps"]
        # Off-policy regime: the first update of a rollout has ratio 1 (eps = base), the second does not.
        if step % 2 == 0:
            assert max(r0["eps"]) == pytest.approx(BASE, abs=1e-3)
        else:
            assert max(r0["eps"]) > BASE + 0.05
    assert local_differs


@pytest.mark.slow
def test_ddp_two_processes_local_clip_ranges_differ_across_ranks(ddp_runs):
    ranks = load_ranks(ddp_runs / "records", "local")
    check_completed(ranks, ddp_runs / "out_local")
    pairs = list(zip(*(r["records"] for r in ranks)))
    assert all(r0["scope"] == r1["scope"] == "local" for r0, r1 in pairs)
    assert any(r0["eps"] != r1["eps"] for r0, r1 in pairs)
    # Each rank's statistics count only its own tokens: 4 completions x at most 8 tokens.
    assert all(sum(r["count"]) <= 4 * 8 for pair in pairs for r in pair)


def guard_logs(rank: dict) -> list[dict]:
    return [{k: v for k, v in e.items() if k.startswith("drift_guard/")} for e in rank["log_history"]
            if "drift_guard/updates_in_rollout" in e]


def check_guard_acted(ranks: list[dict], applied_records: int = 2 * 2) -> None:
    """Both ranks took the guard's decisions together: each rollout applied one update and was cut at its second;
    the optimizer moved twice in 6 steps; only the applied updates' micro-batches reached ACPO's loss (4: 2 updates
    x 2 micro-batches; the cut update's first micro-batch stops before its loss); the ranks logged the same
    measures (the global k3)."""
    for rank in ranks:
        assert rank["global_step"] == 6 and rank["optimizer_steps"] == 2
        assert rank["drift_guard"]["updates_applied"] == 2 and rank["drift_guard"]["rollouts_cut"] == 2
        assert len(rank["records"]) == applied_records
    logs = [guard_logs(rank) for rank in ranks]
    assert logs[0] == logs[1] and len(logs[0]) == 6
    assert [e["drift_guard/updates_in_rollout"] for e in logs[0]] == [1, 1, 1, 1, 1, 1]
    assert [e["drift_guard/rollouts_cut"] for e in logs[0]] == [0, 1, 1, 1, 2, 2]
    assert logs[0][1]["drift_guard/kl"] > 1e-12 and "drift_guard/kl" not in logs[0][2]


@pytest.mark.slow
def test_ddp_drift_guard_takes_one_decision_on_both_ranks(ddp_runs):
    ranks = load_ranks(ddp_runs / "records", "guard")
    check_guard_acted(ranks)
    assert (ddp_runs / "out_guard" / "model.safetensors").exists()


@pytest.mark.slow
def test_ddp_sigterm_saves_one_checkpoint_of_one_step_and_resumes_exactly(tmp_path, tiny_dir, ddp_runs):
    """The SIGTERM reaches rank 1 directly and rank 0 only through the launcher (which forwards its own copy to both:
    rank 1 sees it twice, one request): the ranks stop after the same step, each saves its part of one checkpoint,
    the main process prints one line, and the launcher, given time to wait for its workers, exits 143. The printed
    command (the launcher's) resumes from that checkpoint and ends with the uninterrupted run's weights."""
    import psutil

    recipe = write_recipe(tmp_path, tiny_dir, "preempt", **PREEMPT)
    out = tmp_path / "out_preempt"
    launch_command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP_CONFIG),
                      "--main_process_port", str(free_port()), str(TRAIN_AND_EXIT), "--config", str(recipe)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(LAUNCH_TIMEOUT_S)}
    log = tmp_path / "stopped.log"
    with open(log, "w") as sink:
        launcher = subprocess.Popen(launch_command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while not (metrics.exists() and metrics.read_text().strip()):
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.05)
        rank1 = next(p for p in psutil.Process(launcher.pid).children(recursive=True) if p.environ().get("RANK") == "1")
        start = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        rank1.send_signal(signal.SIGTERM)
        status = launcher.wait(timeout=LAUNCH_TIMEOUT_S)
        stop_s = time.monotonic() - start
    finally:
        launcher.kill()
    text = log.read_text()
    assert status == 143, text[-6000:]
    lines = [line for line in text.splitlines() if line.startswith("acpo-train: stopped by SIGTERM")]
    assert len(lines) == 1, text[-6000:]
    step = int(re.match(r"acpo-train: stopped by SIGTERM after step (\d+) of 10, checkpoint saved in ", lines[0])[1])
    checkpoint = out / f"checkpoint-{step}"
    command = shlex.join(launch_command + ["--resume_from_checkpoint", str(checkpoint)])
    assert lines[0].endswith(f"; resume with: {command}")
    assert 1 <= step < 10 and {"rollout_state_0.pt", "rollout_state_1.pt", "rng_state_0.pth", "rng_state_1.pth",
                                "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}
    assert not (out / "model.safetensors").exists() and not (out / ".acpo-lock").exists()
    print(f"stopped after step {step} (step {step % 4 or 4} of a rollout of 4), {stop_s:.1f} s after SIGTERM")
    try:
        resumed = subprocess.run(shlex.split(command), cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the resumed launch did not finish in {LAUNCH_TIMEOUT_S} s:\n{(error.stderr or '')[-4000:]}")
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    from safetensors.torch import load_file

    ours, theirs = load_file(out / "model.safetensors"), load_file(ddp_runs / "out_preempt" / "model.safetensors")
    print("bit for bit" if same_weights(out, ddp_runs / "out_preempt") else "within 1e-6")
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert (ours[name] - theirs[name]).abs().max() <= 1e-6, name
    evaluated = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
                 if "eval/toy/avg@2" in line]
    assert evaluated == [2, 4, 6, 8, 10]  # each periodic evaluation once: one the stop cut short, after the resume


@pytest.mark.slow
@needs_deepspeed
def test_deepspeed_zero2_on_cpu_matches_ddp(tmp_path, tiny_dir, ddp_runs):
    recipe = write_recipe(tmp_path, tiny_dir, "global", **DIAGNOSTICS)
    launch(ZERO2_CPU_CONFIG, tmp_path / "records", [recipe], *DEEPSPEED_ARGS, env=DEEPSPEED_ENV)
    ranks = load_ranks(tmp_path / "records", "global")
    for rank in ranks:
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED" and rank["backend"] == "gloo"
        assert rank["engine"] == "DeepSpeedEngine" and rank["zero_stage"] == 2
        assert rank["optimizer"] == "DeepSpeedZeroOptimizer"
    check_completed(ranks, tmp_path / "out_global")
    check_ranks_agree(ranks)
    # ZeRO-2's sharded optimizer gives the DDP trajectory.
    check_matches_ddp(ranks, load_ranks(ddp_runs / "records", "global"))


@pytest.mark.slow
@needs_deepspeed
def test_deepspeed_zero3_on_cpu_with_diagnostics_resumes_and_matches_ddp(tmp_path, tiny_dir, ddp_runs):
    """ZeRO-3 (weights, gradients and optimizer states partitioned) with every diagnostic on: the uninterrupted run
    saves checkpoints at steps 2 and 4; a second run, in the same processes, resumes from checkpoint-2. Then the
    drift guard under ZeRO-3: a guarded run, and a run resumed from its checkpoint taken mid-rollout after a cut."""
    save = {"save_strategy": "steps", "save_steps": 2, **DIAGNOSTICS}
    full = write_recipe(tmp_path, tiny_dir, "zero3", **save)
    checkpoint = tmp_path / "out_zero3" / "checkpoint-2"
    resumed = write_recipe(tmp_path, tiny_dir, "zero3_resumed", resume_from_checkpoint=str(checkpoint), **save)
    # The drift guard under ZeRO-3, checkpointed at step 2 (right after the first rollout's cut, mid-rollout) and
    # resumed from there.
    guard_save = {**GUARD, "save_strategy": "steps", "save_steps": 2}
    guard = write_recipe(tmp_path, tiny_dir, "zero3_guard", **guard_save)
    guard_resumed = write_recipe(tmp_path, tiny_dir, "zero3_guard_resumed", **guard_save,
                                 resume_from_checkpoint=str(tmp_path / "out_zero3_guard" / "checkpoint-2"))
    # ACPO_TEST_ZERO3_RELEASE_AFTER_USE: ZeRO-3 releases each weight after every use (stage3_max_reuse_distance 0),
    # as for a model too large to keep them, so the gradient diagnostics meet partitioned weights.
    launch(ZERO3_CPU_CONFIG, tmp_path / "records", [full, resumed, guard, guard_resumed], *DEEPSPEED_ARGS,
           env={**DEEPSPEED_ENV, "ACPO_TEST_ZERO3_RELEASE_AFTER_USE": "1"})
    guard_ranks = load_ranks(tmp_path / "records", "zero3_guard")
    check_guard_acted(guard_ranks)
    resumed_guard = load_ranks(tmp_path / "records", "zero3_guard_resumed")
    for rank, uninterrupted in zip(resumed_guard, guard_ranks):
        # steps 3-6 after the resume: step 3 still skipped (the restored cut), step 4 applied, 5 cut, 6 skipped
        assert rank["drift_guard"] == uninterrupted["drift_guard"] and rank["optimizer_steps"] == 2
        assert len(rank["records"]) == 2  # the applied update of the second rollout: its 2 micro-batches
        assert guard_logs(rank)[2:] == guard_logs(uninterrupted)[2:]
    assert same_weights(tmp_path / "out_zero3_guard", tmp_path / "out_zero3_guard_resumed")
    ranks = load_ranks(tmp_path / "records", "zero3")
    for rank in ranks:
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED" and rank["backend"] == "gloo"
        assert rank["engine"] == "DeepSpeedEngine" and rank["zero_stage"] == 3
        assert rank["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
        # The gradient diagnostics ran at every step (grad_every 1), at least once on weights ZeRO-3 had released.
        assert len(rank["zero3_gathered"]) == MICRO_STEPS and max(rank["zero3_gathered"]) > 0
    check_completed(ranks, tmp_path / "out_zero3")  # model.safetensors: the full weights, gathered on save
    # DeepSpeed's checkpoint: each rank's partition of the weights and of the optimizer states.
    assert {p.name for p in (checkpoint / "global_step2").iterdir()} >= {
        f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in range(2) for kind in ("model", "optim")}
    check_ranks_agree(ranks)
    check_matches_ddp(ranks, load_ranks(ddp_runs / "records", "global"))

    resumed_ranks = load_ranks(tmp_path / "records", "zero3_resumed")
    check_completed(resumed_ranks, tmp_path / "out_zero3_resumed", first_step=2)
    check_ranks_agree(resumed_ranks)
    for rank, uninterrupted in zip(resumed_ranks, ranks):
        # Steps 3-4 after resuming: the weights, optimizer states, scheduler and RNG of step 2 give the same updates.
        for r, u in zip(rank["records"], uninterrupted["records"][2:]):
            assert r["eps"] == pytest.approx(u["eps"], rel=1e-6, abs=1e-7)
            assert r["loss"] == pytest.approx(u["loss"], rel=1e-6, abs=1e-7)
        ours, theirs = logged(rank), logged(uninterrupted)
        assert sorted(ours) == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint's trainer state
        for step in ours:
            assert ours[step] == pytest.approx(theirs[step], rel=1e-6, abs=1e-7), step
    check_matches_ddp(resumed_ranks, load_ranks(ddp_runs / "records", "global"), first_step=2)


@pytest.mark.slow
def test_ddp_diagnostics_with_a_zero_gradient_rank_log_the_same_keys(tmp_path, tiny_dir):
    """Rank 1's advantages are all zero, so its gradient diagnostics have no angle, norm ratio or share to give;
    it must still emit them (as missing values), or the ranks' single metric all-reduce would mismatch."""
    launch(DDP_CONFIG, tmp_path / "records", [], tiny_dir, script=ZERO_ADVANTAGE_RANK)
    ranks = [json.loads((tmp_path / "records" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["steps"] for r in ranks] == [4, 4] and [r["num_processes"] for r in ranks] == [2, 2]
    assert max(ranks[1]["max_advantage"]) == 0.0 and max(ranks[0]["max_advantage"]) > 0
    assert ranks[0]["log_keys"] == ranks[1]["log_keys"]
    logged = set().union(*map(set, ranks[0]["log_keys"]))
    assert {"grad/angle_deg", "grad/share/bin0/pos", "diag/k1/bin4/ratio_std"} <= logged


MULTI_NODE_CONFIG = REPO / "configs" / "accelerate" / "multi_node.yaml"


@pytest.mark.slow
@needs_deepspeed
def test_multi_node_config_runs_as_two_machines(tmp_path, tiny_dir):
    """``configs/accelerate/multi_node.yaml`` launched as two machines on one host: two ``accelerate launch``
    processes, machine ranks 0 and 1, the main process at 127.0.0.1, one process each (gloo on CPU, DeepSpeed
    ZeRO-3 as the file says). Each "node" runs in a folder of its own with a relative output_dir, as two machines
    without a shared disk. Both take the same drift-guard decisions and use the same global clip ranges; the main
    node writes the model, the trainer state and the model card, the other node only its own ZeRO-3 partition,
    RNG and rollout state."""
    recipe = write_recipe(tmp_path, tiny_dir, "nodes", **GUARD, save_strategy="steps", save_steps=2,
                          output_dir="out")
    port = free_port()
    env = {**os.environ, **DEEPSPEED_ENV, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    procs = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(MULTI_NODE_CONFIG),
               "--num_processes", "2", "--machine_rank", str(node), "--main_process_ip", "127.0.0.1",
               "--main_process_port", str(port), "--mixed_precision", "no", str(RECORDER), str(tmp_path / "records"),
               "--config", str(recipe), *DEEPSPEED_ARGS]
        with open(tmp_path / f"node{node}.log", "w") as log:  # a file, not a pipe: nothing blocks on a full pipe
            procs.append(subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT))
    # A node that fails ends the test at once with its output: the other node's launcher would wait for it at its
    # exit barrier for 300 s.
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while time.monotonic() < deadline and None in (codes := [p.poll() for p in procs]) and not any(codes):
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
    codes = [p.wait() for p in procs]
    logs = "".join(f"\n--- node {node}:\n{(tmp_path / f'node{node}.log').read_text()[-4000:]}" for node in (0, 1))
    assert codes == [0, 0], f"exit codes {codes} (-9: killed at {LAUNCH_TIMEOUT_S} s or when the other failed){logs}"
    ranks = load_ranks(tmp_path / "records", "nodes")
    for rank in ranks:
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED" and rank["zero_stage"] == 3
    check_guard_acted(ranks)
    check_ranks_agree(ranks)  # acpo_stats_scope global: the same clip ranges on both nodes, bit for bit
    main, other = tmp_path / "node0" / "out", tmp_path / "node1" / "out"
    for written in ("model.safetensors", "README.md", "checkpoint-2/trainer_state.json", "checkpoint-2/model.safetensors"):
        assert (main / written).exists() and not (other / written).exists(), written
    assert "| drift guard | kl > 1e-12: cut 2 of 2 rollouts short, 2 of 6 updates applied |" in (
        main / "README.md").read_text()
    own = {p.relative_to(other / "checkpoint-2").as_posix() for p in (other / "checkpoint-2").rglob("*") if p.is_file()}
    assert own and all("rank_1" in name or name.endswith("_1.pth") or name.endswith("_1.pt") for name in own), own
