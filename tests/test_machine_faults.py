"""What a machine does to a run (issue 62): a full disk, two runs in one folder, a scheduler's preemption.

- A full disk: a run whose output folder cannot hold what it will write is refused before it trains, in one line (the
  free space mocked); a write that fails anyway (a real one: the process may write no file past 200 kB,
  RLIMIT_FSIZE, so the kernel fails the write with EFBIG as a full disk does with ENOSPC) keeps the report, written
  before the model, leaves no half-written file and ends in one line naming the file and the errno.
- One run per folder: a lock whose run is gone is taken over; one of another host is not; ``acpo-eval``,
  ``acpo-study`` and ``acpo-warmup`` refuse a busy folder, as ``acpo-train`` does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "PYTHONDONTWRITEBYTECODE": "1"}
TIMEOUT_S = 300


def write_recipe(folder: Path, tiny_dir: str, **overrides) -> str:
    config = {
        "model_name_or_path": tiny_dir, "task": "toy", "num_train_tasks": 64, "num_eval_tasks": 4, "eval_k": 2,
        "output_dir": str(folder / "out"), "use_cpu": True, "bf16": False, "per_device_train_batch_size": 8,
        "num_generations": 4, "steps_per_generation": 2, "max_completion_length": 8, "learning_rate": 0.01,
        "max_steps": 4, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0,
        "disable_tqdm": True,
    }
    config.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def acpo_train(*args: str) -> list[str]:
    return [sys.executable, "-m", "acpo_trl.train", *args]


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
    config = write_recipe(tmp_path, tiny_dir, save_strategy="steps", save_steps=2)
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

    config = write_recipe(tmp_path, tiny_dir, report=True, max_steps=2)
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
    from acpo_trl.training.warmup import main as warmup
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
