"""What a machine does to a run (issue 62): a full disk, two runs in one folder, a scheduler's preemption.

- One run per folder: a lock whose run is gone is taken over; one of another host is not; ``acpo-eval``,
  ``acpo-study`` and ``acpo-warmup`` refuse a busy folder, as ``acpo-train`` does.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys

import pytest
import yaml


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
