"""benchmarks/gpu_check.py, the prepared check for a CUDA GPU machine (docs/gpu_check.md): its ``--tiny`` mode runs
the same code on CPU with a tiny model, so that the script cannot rot where CI has no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
DOC = REPO / "docs" / "gpu_check.md"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # standard library only at import: cheap
    return module


@pytest.mark.slow
def test_tiny_check_reports_every_figure(tmp_path):
    gpu_check = load_script()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.md").read_text()

    assert results["mode"] == "tiny" and results["status"] == 0
    assert results["parts"] == {part: "ok" for part in gpu_check.PARTS}
    assert results["wall_s"] <= results["budget_s"]
    for path, part, figure, unit in gpu_check.figures("cpu"):
        value = gpu_check.lookup(results, path)
        assert isinstance(value, (int, float)) and value == value, f"{path}: {value!r}"  # a number, not NaN
        assert f"| {figure} | {gpu_check.fmt(value)} | {unit} |" in table, figure
    # without a GPU every CUDA test is collected and skipped, none fails
    tests = results["cuda_tests"]
    assert tests["failed"] == 0 and tests["passed"] == 0 and tests["skipped"] >= 3
    assert (tmp_path / "cuda_tests.xml").exists() and (tmp_path / "log.txt").exists()
    for part, spec in gpu_check.STEPS["tiny"].items():
        step = results[part]
        assert step["losses_finite"] and step["rounds"] >= 1 and step["model"]["activation_checkpointing"]
        assert step["trainers"] == list(spec["trainers"])
        assert step["batch"]["completion_len"] == spec["completion_len"]
        for key in spec["trainers"]:
            assert 0.0 <= step[key]["clip_frac"] <= 1.0
            if key != "grpo":  # every trainer against GRPOTrainer of the same process
                assert step[key]["step_ratio"] == pytest.approx(step[key]["step_s"] / step["grpo"]["step_s"])
        assert step["grpo"]["clip_eps"] == 0.2
        assert step["acpo"]["clip_eps"] >= 0.2  # ACPO's range opens from the base with the ratio's spread
    # the paper-scale step's controls: ACPO's bins at a fixed clip's width, and a fixed clip as wide as ACPO's cap
    paper = results["paper_step"]
    assert paper["acpo_alpha0"]["clip_eps"] == pytest.approx(0.2)
    assert paper["ppo_clip"]["clip_eps"] == 0.2
    assert paper["ppo_clip_wide"]["clip_eps"] == gpu_check.WIDE_EPSILON
    assert "- paper-scale step: tiny Qwen2 (hidden 64, 3 layers)" in table
    assert "| paper-scale step | ACPOTrainer (acpo, acpo_alpha 0) step time / GRPOTrainer's |" in table
    assert "| paper-scale step | ACPOTrainer (ppo_clip, epsilon 3) step time / GRPOTrainer's |" in table
    assert results["loss_compiled"]["matches_eager"] is True
    machine = results["machine"]
    assert machine["gpu"] is None and machine["torch"] and machine["trl"]
    assert machine["acpo_trl"] == str(REPO / "acpo_trl")  # this checkout, never an installed copy
    for name in ("torch", "transformers", "trl"):
        assert f"{name} {machine[name]}" in table


def test_the_tiny_steps_run_every_trainer_the_gpu_runs():
    gpu_check = load_script()
    full, tiny = gpu_check.STEPS["full"], gpu_check.STEPS["tiny"]
    assert set(full) == set(tiny) and set(full) <= set(gpu_check.PARTS)
    for part in full:
        assert tiny[part]["trainers"] == full[part]["trainers"], part
    assert full["paper_step"]["trainers"] == tuple(gpu_check.STEP_TRAINERS)
    # the paper's scale: Qwen2.5-3B's shape (3.09 B parameters), 8 completions of 3,072 tokens
    paper = full["paper_step"]
    assert paper["model"] == gpu_check.QWEN25_3B and (paper["completions"], paper["completion_len"]) == (8, 3072)
    for mode in gpu_check.MODES.values():
        assert set(mode["caps"]) == set(mode["reserve"]) == set(gpu_check.PARTS)


def _fake_pip(codes):
    calls, codes = [], iter(codes)

    def run(command, log):
        calls.append(command)
        return subprocess.CompletedProcess(command, next(codes), stdout="pip output")

    return calls, run


@pytest.mark.parametrize("codes, mode", [((0,), "resolved"), ((1, 0), "no-deps fallback"), ((1, 1), "failed")])
def test_the_offline_install_uses_no_index_and_never_installs_the_package(tmp_path, codes, mode):
    gpu_check = load_script()
    wheels = tmp_path / "gpu_wheels"
    wheels.mkdir()
    calls, run = _fake_pip(codes)
    record = gpu_check.install_wheels(str(wheels), log=None, run=run)
    assert record["mode"] == mode and record["package"].startswith("not installed")
    resolve, as_they_are = gpu_check.install_commands(str(wheels))
    assert calls == [resolve, as_they_are][:len(codes)]
    for command in calls:
        assert command[1:6] == ["-m", "pip", "install", "--no-index", "--find-links"] and command[6] == str(wheels)
        # no editable install of the checkout: setuptools' develop would call pip again, on an index
        assert "-e" not in command and str(REPO) not in command
    assert resolve[-len(gpu_check.INSTALL_REQUIREMENTS):] == list(gpu_check.INSTALL_REQUIREMENTS)
    assert as_they_are[-len(gpu_check.WHEELS) - 1:] == ["--no-deps", *gpu_check.WHEELS]


def test_every_file_with_cuda_tests_is_run_by_the_check():
    gpu_check = load_script()
    marked = {f"tests/{path.name}" for path in (REPO / "tests").glob("test_*.py")
              if re.search(r"pytest\.mark\.cuda\b", path.read_text())}
    assert marked == set(gpu_check.CUDA_TEST_FILES)


def test_the_doc_gives_the_wheels_and_the_commands():
    gpu_check = load_script()
    doc = DOC.read_text()
    for pin in gpu_check.WHEELS:
        assert pin in doc, pin
    for command in ("python benchmarks/gpu_check.py --download-wheels gpu_wheels",
                    "python3 benchmarks/gpu_check.py --wheels gpu_wheels --out gpu_results",
                    "python benchmarks/gpu_check.py --tiny --out"):
        assert command in doc, command
    assert "/gpu_wheels/" in (REPO / ".gitignore").read_text()
    # no torch wheel travels: the GPU machine's own torch must stay
    assert not any(pin.split("==")[0] in ("torch", "vllm") for pin in gpu_check.WHEELS)
