"""examples/notebooks/acpo_qwen_finetune.ipynb runs end to end (smoke settings: tiny model, 2 steps, CPU) and
is committed with its outputs cleared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "acpo_qwen_finetune.ipynb"


def test_notebook_is_committed_without_outputs():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), "clear the notebook's outputs"


@pytest.mark.slow
def test_notebook_runs_end_to_end_offline(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # Smoke settings, and no Hub: the notebook must fall back by itself (an empty HF cache, so that a Qwen
    # checkpoint cached on this machine is not picked up).
    monkeypatch.setenv("ACPO_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("ACPO_NOTEBOOK_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.delenv("ACPO_NOTEBOOK_MODEL", raising=False)
    monkeypatch.delenv("ACPO_NOTEBOOK_TASK", raising=False)

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    text = "\n".join(
        out.get("text", "") + "\n".join(str(v) for v in out.get("data", {}).values())
        for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )
    assert "Hub unreachable (no network, or HF_HUB_OFFLINE is set)" in text and "FALLBACK: training tiny local test model" in text
    assert "2 optimizer updates per rollout; on-policy: False" in text
    assert any(out.get("data", {}).get("image/png") for cell in nb.cells if cell.cell_type == "code"
               for out in cell.outputs), "the training-curves plot is displayed"
    assert "Not pushed (PUSH_TO_HUB = False)" in text

    out = tmp_path / "out"
    assert (out / "model.safetensors").stat().st_size > 0
    assert (out / "training_curves.png").stat().st_size > 10_000
    results = json.loads((out / "eval_before_after.json").read_text())
    assert set(results) == {"model", "before", "after"}
    for stage in ("before", "after"):
        assert 0.0 <= results[stage]["eval/addition/avg@2"] <= 1.0
