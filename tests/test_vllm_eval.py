"""`acpo-eval --backend vllm` executed for real with vLLM's CPU build (issue 15.2 and 15.3): the CPU defaults reach
the engine, and in float32 at temperature 0 vLLM gives the transformers backend's greedy completions, avg@k and
pass@k, with and without a LoRA adapter. One engine (LoRA enabled) serves the whole module; requests without the
adapter run the base model. The dlogp toolkit has no vLLM path; its emulation of the authors' vLLM top-k view is
checked against vLLM's own top-k log-probs.
"""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

pytest.importorskip(
    "vllm", reason="needs vLLM: .ci/run installs its CPU build in a second venv (docs/evaluation.md)"
)

import torch  # noqa: E402

from acpo_trl.evaluation import EvalConfig, evaluate  # noqa: E402  # noqa: E402
from acpo_trl.evaluation.benchmarks import Benchmark  # noqa: E402  # noqa: E402
from acpo_trl.evaluation.generation import (  # noqa: E402
    VLLM_CPU_KV_CACHE_GIB,
    SamplingSettings,
    TransformersBackend,
    load_model_and_tokenizer,
    vllm_cpu_defaults,
)
from acpo_trl.evaluation.runner import build_backend, compute_metrics, group_problems, sample_benchmark  # noqa: E402  # noqa: E402

MAX_TOKENS = 16
# Varied prompts, so that the greedy completions (and the arbitrary reward below) differ between problems.
PROMPTS = ["Write the letter a:", "1 + 1 =", "Hello, world", "The quick brown fox", "{[(<", "zzzz", "AbCdEf", "0x7f"]


def parity_reward(prompts, completions, **kwargs):
    """An arbitrary deterministic 0/1 reward (a bit of the completion's hash): a random tiny model solves no real
    benchmark, and this gives avg@k and pass@k values strictly between 0 and 1 to compare."""
    return [float(hashlib.sha256(c.encode()).digest()[0] & 1) for c in completions]


@pytest.fixture(scope="module")
def adapter_dir(tiny_vllm_dir, tmp_path_factory):
    """A PEFT LoRA adapter of the tiny model with random (non-zero) weights on every projection."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_vllm_dir, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False))
    path = tmp_path_factory.mktemp("tiny_vllm_lora")
    peft_model.save_pretrained(path)
    return str(path)


def eval_config(model_dir, adapter, backend, output_dir, **overrides) -> EvalConfig:
    settings = dict(
        model_name_or_path=model_dir, adapter_path=adapter, backend=backend, benchmarks=["math500"], limit=4, k=2,
        seeds=[0, 1], temperature=0.0, max_tokens=MAX_TOKENS, dtype="float32", output_dir=str(output_dir),
    )
    return EvalConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def vllm_backends(tiny_vllm_dir, adapter_dir, tmp_path_factory):
    """{"base": ..., "lora": ...}: one engine built as `acpo-eval --backend vllm --adapter_path ...` builds it, with
    nothing CPU-specific set by the caller (the defaults under test), shared by the base model and the adapter."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_CI_ENV"):
            mp.delenv(name, raising=False)
        lora = build_backend(eval_config(tiny_vllm_dir, adapter_dir, "vllm", tmp_path_factory.mktemp("unused")))
    base = copy.copy(lora)
    base.lora_request = None
    yield {"base": base, "lora": lora}
    lora.llm.llm_engine.engine_core.shutdown()


def test_cpu_defaults_fill_only_what_the_user_left_unset(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert vllm_cpu_defaults(None) == {"enforce_eager": True, "kv_cache_memory_bytes": VLLM_CPU_KV_CACHE_GIB << 30}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert vllm_cpu_defaults(False) == {"enforce_eager": False}


def test_the_engine_runs_with_the_cpu_defaults_and_the_given_dtype(vllm_backends):
    config = vllm_backends["lora"].llm.llm_engine.vllm_config
    assert config.model_config.dtype == torch.float32  # not vLLM's "auto" downcast to bfloat16
    assert config.model_config.enforce_eager
    assert config.cache_config.kv_cache_memory_bytes == VLLM_CPU_KV_CACHE_GIB << 30


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["base", "lora"])
def test_greedy_vllm_evaluation_equals_the_transformers_backend(variant, vllm_backends, tiny_vllm_dir, adapter_dir,
                                                                 tmp_path):
    adapter = adapter_dir if variant == "lora" else None
    model, tokenizer = load_model_and_tokenizer(tiny_vllm_dir, adapter, dtype="float32")
    transformers_backend = TransformersBackend(model, tokenizer, SamplingSettings(0.0, 1.0, MAX_TOKENS))
    backends = {"vllm": vllm_backends[variant], "transformers": transformers_backend}

    # acpo-eval's runner on a shipped benchmark: every sample and metric of results.json
    results = {}
    for name, backend in backends.items():
        config = eval_config(tiny_vllm_dir, adapter, name, tmp_path / name)
        evaluate(config, backend=backend, progress=False)
        results[name] = json.loads((tmp_path / name / "results.json").read_text())
    samples = {name: [p["samples"] for p in r["problems"]] for name, r in results.items()}
    assert samples["vllm"] == samples["transformers"]
    assert results["vllm"]["metrics"] == results["transformers"]["metrics"]
    assert any(s["num_tokens"] > 1 for problem in samples["vllm"] for s in problem)

    # avg@k and pass@k that are neither 0 nor 1, from the same greedy completions
    from datasets import Dataset

    benchmark = Benchmark("parity", Dataset.from_dict({"prompt": PROMPTS}), parity_reward)
    metrics = {}
    for name, backend in backends.items():
        records = sample_benchmark(benchmark, backend, samples_per_seed=2, seeds=[0, 1], batch_size=4, progress=False)
        metrics[name] = compute_metrics(group_problems(records, [0, 1]), pass_k=[1, 4])["parity"]
        texts = [s["completion"] for r in sorted(records, key=lambda r: (r["index"], r["seed"])) for s in r["samples"]]
        metrics[name]["texts"] = texts
    assert metrics["vllm"] == metrics["transformers"]
    assert 0 < metrics["vllm"]["avg@4"] < 1 and 0 < metrics["vllm"]["pass@1"] < 1


@pytest.mark.slow
def test_the_adapter_is_applied_by_vllm(vllm_backends, tiny_vllm_dir):
    _, tokenizer = load_model_and_tokenizer(tiny_vllm_dir, dtype="float32")
    prompt_ids = [list(tokenizer(p)["input_ids"]) for p in PROMPTS]
    base = vllm_backends["base"].generate(prompt_ids, 1, seed=0)
    lora = vllm_backends["lora"].generate(prompt_ids, 1, seed=0)
    assert [g[0].text for g in base] != [g[0].text for g in lora]


@pytest.mark.slow
def test_vllm_top_k_logprobs_equal_the_dlogp_emulation_of_the_authors_view(vllm_backends, tiny_vllm_dir):
    """docs/dlogp.md: the toolkit scores with transformers only and emulates the authors' vLLM top-50 view
    (``top_k_padded`` of the exact log-probs); here vLLM's own top-k prompt log-probs are that view, to 1e-4 in
    float32. k = 20, the engine's default ``max_logprobs`` (the authors raised it to 50; the view is the same
    function of k)."""
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    from acpo_trl.dlogp.metrics import top_k_padded

    k = 20
    _, tokenizer = load_model_and_tokenizer(tiny_vllm_dir, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(tiny_vllm_dir, dtype=torch.float32)
    ids = list(tokenizer("The quick brown fox jumps over the lazy dog")["input_ids"])
    (output,) = vllm_backends["base"].llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=k), use_tqdm=False
    )
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    padded, in_top_k = top_k_padded(logp, k)
    for t, position in enumerate(output.prompt_logprobs[1:]):  # entry t + 1 is predicted from ids[: t + 1]
        top = {token: lp.logprob for token, lp in position.items() if lp.rank <= k}
        assert len(top) == k
        tokens = sorted(top)
        torch.testing.assert_close(torch.tensor([top[i] for i in tokens]), padded[t, tokens], rtol=0, atol=1e-4)
        assert min(top.values()) == pytest.approx(padded[t].min().item(), abs=1e-4)  # the pad value
        for token in set(tokens) - set(in_top_k[t].nonzero().flatten().tolist()):  # ranked in by vLLM only: a tie
            assert logp[t, token].item() == pytest.approx(padded[t].min().item(), abs=1e-4)
