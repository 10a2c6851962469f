"""What a machine does to a run (issue 62): a full disk, two runs in one folder, a scheduler's preemption.

- A full disk: a run whose output folder cannot hold what it will write is refused before it trains, in one line (the
  free space mocked); a write that fails anyway (a real one: the process may write no file past 200 kB,
  RLIMIT_FSIZE, so the kernel fails the write with EFBIG as a full disk does with ENOSPC) keeps the report, written
  before the model, leaves no half-written file and ends in one line naming the file and the errno.
- One run per folder: a second real ``acpo-train`` process into a busy folder is refused in one line that names the
  first, before it loads the model; a lock whose run is gone is taken over; ``acpo-eval``, ``acpo-study`` and
  ``acpo-warmup`` refuse a busy folder too.
- A preemption: a real SIGTERM to a real ``acpo-train`` process mid-run saves a checkpoint of the step in flight, prints
  the command that resumes, and exits with 143; that command ends with the weights of an uninterrupted run. The same
  under ``accelerate launch`` with two processes: ``tests/test_distributed_training.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import write_toy_recipe

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "PYTHONDONTWRITEBYTECODE": "1"}
TIMEOUT_S = 300
# 4 optimizer updates per rollout, so that a stop after most steps is a stop within a rollout.
STOP = {"max_steps": 10, "steps_per_generation": 4, "report": True}


def acpo_train(*args: str) -> list[str]:
    return [sys.executable, "-m", "acpo_trl.train", *args]


def wait_for(condition, process, what: str, log: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached (exit status {process.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.05)


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def assert_same_weights(ours: dict, theirs: dict) -> None:
    """Equal to 1e-6 (bit for bit where the runs are: reported by the caller's assert message)."""
    import torch

    assert sorted(ours) == sorted(theirs)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6, msg=name)


# --- A full disk ------------------------------------------------------------------------------------------------


def test_a_folder_without_room_is_refused_before_training(tmp_path, tiny_dir, monkeypatch, capsys):
    """2 MB free (mocked), and the run would write 2.55 MB: the final model (90,944 float32 weights, 364 KB) and its
    two checkpoints (the model and AdamW's two float32 moments, 1.09 MB each). Refused once the model is loaded,
    before any step; with ``check_disk_space: false`` it trains."""
    import shutil

    import acpo_trl.train as train_module
    from acpo_trl.trainer import ACPOTrainer

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=2_000_000))
    trained = []
    monkeypatch.setattr(ACPOTrainer, "train", lambda self, *args, **kwargs: trained.append(self.state.global_step))
    config = write_toy_recipe(tmp_path, tiny_dir, save_strategy="steps", save_steps=2)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as end:
        train_module.main(["--config", config])
    err = capsys.readouterr().err
    assert end.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"acpo-train: error: output_dir {out} has 2 MB free, and this run writes 2.55 MB there (the final model of "
        "364 KB and 2 checkpoints of 1.09 MB each, with the optimizer state) (make room there, give another "
        "output_dir, or set check_disk_space: false to go on)")
    assert trained == [] and sorted(p.name for p in out.iterdir()) == []  # nothing written, the lock released
    train_module.main(["--config", config, "--check_disk_space", "false"])
    assert trained == [0] and (out / "model.safetensors").exists()


@pytest.mark.slow
def test_a_write_that_fails_loses_only_the_model_and_says_so_in_one_line(tmp_path, tiny_dir):
    """The model (364 KB) cannot be written; the report, the evaluation and the plot, written before it, are whole,
    and nothing half-written is left. An earlier run's model in the folder stays as it was."""
    import resource

    config = write_toy_recipe(tmp_path, tiny_dir, report=True, max_steps=2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"an earlier run's model")

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))

    env = {**ENV, "MPLCONFIGDIR": str(tmp_path / "matplotlib")}
    result = subprocess.run(acpo_train("--config", config), cwd=REPO, env=env, capture_output=True, text=True,
                            preexec_fn=small_files, timeout=TIMEOUT_S)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-4000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"acpo-train: error: writing {out}/model.safetensors failed: [Errno 27] File too large (make room on that "
        "disk and run again; with --resume_from_checkpoint true, acpo-train resumes from its last checkpoint)")
    assert (out / "model.safetensors").read_bytes() == b"an earlier run's model"
    assert "| eval/toy/avg@2 |" in (out / "report.md").read_text()
    assert set(json.loads((out / "eval_before_after.json").read_text())) == {"before", "after"}
    assert (out / "training_curves.png").stat().st_size > 10_000
    assert not (out / "config.json").exists()  # the model's other files went with it
    assert not [p.name for p in out.iterdir() if p.name.startswith(".acpo")]  # no staging folder, no lock


def test_a_checkpoint_whose_writing_fails_is_removed(tmp_path, monkeypatch):
    """torch.save names neither the file nor the errno ("PytorchStreamWriter failed writing file"): the file is the
    path the writer was given, the errno ENOSPC when the disk is left full. A failure that is no write keeps its
    exception; the partial checkpoint goes either way (no resume starts from part of it)."""
    import shutil

    import torch

    from acpo_trl.utils.run_folder import WriteFailed, whole_or_removed

    checkpoint = tmp_path / "checkpoint-3"

    def save(obj, f):  # what torch.save does on a full disk: a partial file and an error that names nothing
        Path(f).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(torch, "save", save)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=4096))
    with pytest.raises(WriteFailed, match=re.escape(f"writing {checkpoint}/optimizer.pt failed: [Errno 28] No space "
                                                    "left on device")):
        with whole_or_removed(str(checkpoint)):
            checkpoint.mkdir()
            (checkpoint / "model.safetensors").write_bytes(b"whole")
            torch.save({}, str(checkpoint / "optimizer.pt"))
    assert not checkpoint.exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10**12))
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):  # a disk with room: not taken for a full one
        with whole_or_removed(str(checkpoint)):
            checkpoint.mkdir()
            torch.save({}, str(checkpoint / "optimizer.pt"))
    assert not checkpoint.exists()


# --- One run per folder ------------------------------------------------------------------------------------------


def lock_record(pid: int, host: str | None = None, **fields) -> dict:
    from acpo_trl.utils.run_folder import _process_start

    return {"host": host or socket.gethostname(), "pid": pid, "start": _process_start(pid),
            "command": "acpo-train --config first.yaml", "started": "2026-12-01 10:00:00", **fields}


def test_a_lock_whose_run_is_gone_is_taken_over_and_another_hosts_is_not(tmp_path, caplog):
    from acpo_trl.utils.cli_errors import UserError
    from acpo_trl.utils.run_folder import LOCK, claimed

    lock = tmp_path / LOCK
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    parent = os.getppid()
    for record in (lock_record(dead, start=1), lock_record(parent, start=-1)):  # no process; a later one, same pid
        lock.write_text(json.dumps(record))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="acpo_trl.utils.run_folder"), claimed(tmp_path, "acpo-train"):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert caplog.messages == [f"{tmp_path}: taking the folder over from a run that is gone (pid "
                                   f"{record['pid']} on {socket.gethostname()}, started 2026-12-01 10:00:00: "
                                   "acpo-train --config first.yaml)"]
        assert not lock.exists()
    elsewhere = lock_record(12345, host="node-7")
    lock.write_text(json.dumps(elsewhere))
    with pytest.raises(UserError) as refused:
        with claimed(tmp_path, "acpo-train"):
            pytest.fail("a run of another host holds the folder")
    assert str(refused.value) == (f"{tmp_path} is in use by another run: acpo-train --config first.yaml (pid 12345 "
                                  "on node-7, started 2026-12-01 10:00:00) (wait for it to end, or give another "
                                  f"output_dir; if it is no longer running, delete {lock})")
    assert json.loads(lock.read_text()) == elsewhere


def test_eval_study_and_warmup_refuse_a_busy_folder(tmp_path, tiny_dir, capsys):
    """Each where it writes: acpo-eval's --output_dir, acpo-study's --out, acpo-warmup's recipe model folder."""
    from acpo_trl.evaluation.cli import main as evaluate
    from acpo_trl.study.cli import main as study
    from acpo_trl.warmup import main as warmup
    from acpo_trl.utils.run_folder import LOCK

    recipe = tmp_path / "warmup.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": str(tmp_path / "warm"), "task": "running_sum",
                                      "prompt_template": "chat"}))
    cases = [  # (main, its name, the folder it writes, its arguments, the setting that names the folder)
        (evaluate, "acpo-eval", tmp_path / "eval",
         ["--model_name_or_path", tiny_dir, "--limit", "1", "--output_dir", str(tmp_path / "eval")], "--output_dir"),
        (study, "acpo-study", tmp_path / "study", ["run", "--quick", "--no-report", "--out", str(tmp_path / "study")],
         "--out"),
        (warmup, "acpo-warmup", tmp_path / "warm", ["--recipe", str(recipe), "--base_model", tiny_dir],
         f"model_name_or_path of --recipe {recipe}"),
    ]
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as running:
        try:
            for main, prog, folder, argv, field in cases:
                folder.mkdir()
                (folder / LOCK).write_text(json.dumps(lock_record(running.pid)))
                with pytest.raises(SystemExit) as end:
                    main(argv)
                err = capsys.readouterr().err
                assert end.value.code == 2, err
                assert err.strip().splitlines()[-1] == (
                    f"{prog}: error: {folder} is in use by another run: acpo-train --config first.yaml (pid "
                    f"{running.pid} on {socket.gethostname()}, started 2026-12-01 10:00:00) (wait for it to end, or "
                    f"give another {field})")
                assert sorted(p.name for p in folder.iterdir()) == [LOCK]
        finally:
            running.kill()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, tiny_dir):
    """A real ``acpo-train`` run (A) frozen with SIGSTOP once it holds its folder, while a second run (B) into the same
    folder starts and is refused; then let go, and sent SIGTERM once it has logged its first step."""
    work = tmp_path_factory.mktemp("stopped")
    config = write_toy_recipe(work, tiny_dir, **STOP)
    out = work / "out"
    log = work / "a.log"
    with open(log, "w") as sink:
        first = subprocess.Popen(acpo_train("--config", config), cwd=REPO, env=ENV, stdout=sink, stderr=sink)
    try:
        wait_for((out / ".acpo-lock").exists, first, "A holds its folder", log)
        first.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        second = subprocess.run(acpo_train("--config", config), cwd=REPO, env=ENV, capture_output=True, text=True,
                                timeout=TIMEOUT_S)
        second_s = time.monotonic() - start
        first.send_signal(signal.SIGCONT)
        metrics = out / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.read_text().strip(), first, "A logs its first step", log)
        start = time.monotonic()
        first.send_signal(signal.SIGTERM)
        status = first.wait(timeout=TIMEOUT_S)
        stop_s = time.monotonic() - start
    finally:
        first.kill()
    return SimpleNamespace(config=config, out=out, pid=first.pid, second=second, second_s=second_s, status=status,
                           stop_s=stop_s, log=log.read_text())


@pytest.mark.slow
def test_a_second_run_into_a_busy_folder_is_refused_in_one_line(stopped):
    second = stopped.second
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-4000:]
    assert second.stderr.strip().splitlines()[-1].startswith(
        f"acpo-train: error: {stopped.out} is in use by another run: acpo-train --config {stopped.config} (pid "
        f"{stopped.pid} on {socket.gethostname()}, started ")
    assert second.stderr.strip().endswith("(wait for it to end, or give another output_dir)")
    assert "Loading weights" not in second.stderr  # refused before its model is loaded
    print(f"refused in {stopped.second_s:.1f} s")


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_the_printed_command_resumes_exactly(stopped, tmp_path, tiny_dir):
    """Exit status 143; one line with the command; the checkpoint of the step in flight holds the rollout state
    (within a rollout: TRL's micro-step counter and the rollout being reused). That command, run as printed, ends with
    the weights of an uninterrupted run, and its metrics.jsonl has every step once."""
    from acpo_trl.recipe import make_parser
    from acpo_trl.run import run

    assert stopped.status == 143, stopped.log[-4000:]
    lines = [line for line in stopped.log.splitlines() if line.startswith("acpo-train: stopped by SIGTERM")]
    assert len(lines) == 1, stopped.log[-4000:]
    step = int(re.match(r"acpo-train: stopped by SIGTERM after step (\d+) of 10, checkpoint saved in ", lines[0])[1])
    checkpoint = stopped.out / f"checkpoint-{step}"
    command = shlex.join(["acpo-train", "--config", stopped.config, "--resume_from_checkpoint", str(checkpoint)])
    assert lines[0].endswith(f"checkpoint saved in {checkpoint}; resume with: {command}")
    assert 1 <= step < 10 and (checkpoint / "rollout_state_0.pt").exists()
    assert not [p for p in ("model.safetensors", "report.md", ".acpo-lock") if (stopped.out / p).exists()]
    print(f"stopped after step {step} (step {step % 4 or 4} of a rollout of 4), {stopped.stop_s:.1f} s after SIGTERM")

    resumed = subprocess.run(acpo_train(*shlex.split(command)[1:]), cwd=REPO, env=ENV, capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    reference = tmp_path / "uninterrupted"
    run(*make_parser().parse_args_and_config(args=["--config", stopped.config, "--output_dir", str(reference)]))
    ours, theirs = weights(stopped.out), weights(reference)
    print("bit for bit" if all(ours[k].equal(theirs[k]) for k in ours) else "within 1e-6")
    assert_same_weights(ours, theirs)
    steps = [json.loads(line)["step"] for line in (stopped.out / "metrics.jsonl").read_text().splitlines()
             if "policy_loss" in line]
    assert steps == list(range(1, 11))


def test_a_stop_during_the_last_steps_evaluation_saves_that_step_at_once_and_the_resume_evaluates_it(
        tmp_path, tiny_dir, monkeypatch, capsys):
    """SIGTERM during the periodic evaluation after the last step (the stop a session's end met on the long task,
    where the evaluation takes 20 minutes): that evaluation ends after the batch in flight, the step's checkpoint is
    saved and acpo-train exits 143. The printed command resumes: it evaluates that step when training begins, once,
    and ends with the uninterrupted run's evaluations (metrics.jsonl and the report's) and weights."""
    import acpo_trl.evaluation.callback as callback
    from acpo_trl.train import main

    config = write_toy_recipe(tmp_path, tiny_dir, report=True, report_eval_steps=2, eval_batch_size=1)
    out = tmp_path / "out"
    real = callback.sample_benchmark
    batches: list[int] = []  # batches generated by each evaluation: before training, step 2, step 4, ...
    stop_at = [3]  # the third evaluation (after step 4), in its first batch

    def sampling(*args, on_batch, **kwargs):
        batches.append(0)

        def counted(records):
            batches[-1] += 1
            if stop_at and len(batches) == stop_at[0] and batches[-1] == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            on_batch(records)

        return real(*args, on_batch=counted, **kwargs)

    monkeypatch.setattr(callback, "sample_benchmark", sampling)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with pytest.raises(SystemExit) as end:
            main(["--config", config])
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    checkpoint = out / "checkpoint-4"
    assert end.value.code == 143 and batches == [4, 4, 1]  # 4 held-out problems, one per batch
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"acpo-train: stopped by SIGTERM after step 4 of 4, checkpoint saved in {checkpoint}; ")
    assert (checkpoint / "trainer_state.json").exists() and not (out / "eval_before_after.json").exists()

    stop_at.clear()
    main(["--config", config, "--resume_from_checkpoint", str(checkpoint)])
    assert batches == [4, 4, 1, 4, 4]  # before training, then step 4's evaluation once (the report reuses it)
    main(["--config", config, "--output_dir", str(tmp_path / "uninterrupted")])

    def evaluations(folder: Path) -> tuple[dict, dict]:
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        logged = [(e["step"], {k: v for k, v in e.items() if k.startswith("eval/")}) for e in lines
                  if any(k.startswith("eval/") for k in e)]
        assert [step for step, _ in logged] == [2, 4]
        return dict(logged), json.loads((folder / "eval_before_after.json").read_text())

    assert evaluations(out) == evaluations(tmp_path / "uninterrupted")
    assert_same_weights(weights(out), weights(tmp_path / "uninterrupted"))
