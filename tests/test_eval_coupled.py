"""The coupled sampler (acpo_trl/evaluation/coupled.py): its hash against a reference, its token frequencies against
the softmax (a chi-square bound that a wrong sampler fails), batch invariance, and the coupling of two models."""

from __future__ import annotations

import json

import pytest
import torch

from acpo_trl.evaluation import coupled
from acpo_trl.evaluation.benchmarks import Benchmark
from acpo_trl.evaluation.config import EvalConfig
from acpo_trl.evaluation.generation import SamplingSettings, TransformersBackend, tokenize_prompt
from acpo_trl.evaluation.runner import evaluate, sample_benchmark
from acpo_trl.tasks.toy import toy_dataset, toy_reward
from acpo_trl.utils.tiny_models import build_tiny_model

UINT64 = (1 << 64) - 1
P_VALUE = 1e-3  # a right sampler fails at this rate; the draws are fixed, so the test is deterministic


def reference_mix(z: int) -> int:
    """splitmix64's output function in Python integers (Vigna's splitmix64.c), modulo 2^64 explicitly."""
    z &= UINT64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & UINT64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & UINT64
    return z ^ (z >> 31)


def test_int64_hash_equals_the_uint64_reference():
    phi = 0x9E3779B97F4A7C15
    keys = [0, 1, -1, 2**63 - 1, -(2**63), 0x123456789ABCDEF, coupled._int64(0xDEADBEEFCAFEBABE)]
    position, vocab = 5, 7
    noise = coupled.gumbel_noise(torch.tensor(keys), position, vocab)
    for row, key in enumerate(keys):
        state = reference_mix(key + (position + 1) * phi)
        for v in range(vocab):
            u = ((reference_mix(state + (v + 1) * phi) >> 11) + 0.5) / 2**53
            assert noise[row, v].item() == pytest.approx(-torch.tensor(u, dtype=torch.float64).log().neg().log().item(),
                                                         rel=1e-12)


def nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """softmax(logits / T) on the smallest set of most probable tokens holding at least ``top_p`` of the mass (a
    token is kept when the tokens above it hold less than ``top_p``), renormalised."""
    probs = torch.softmax(logits.double() / temperature, -1)
    ordered, order = probs.sort(descending=True)
    above = ordered.cumsum(0) - ordered
    kept = torch.zeros_like(probs).scatter(0, order, (above < top_p).double())
    return probs * kept / (probs * kept).sum()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs``; 0 when a token of probability 0 was drawn."""
    if counts[probs == 0].any():
        return 0.0
    expected = probs[probs > 0] * counts.sum()
    statistic = ((counts[probs > 0] - expected) ** 2 / expected).sum()
    return torch.special.gammaincc(torch.tensor((len(expected) - 1) / 2.0), statistic / 2).item()


LOGITS = torch.tensor([2.0, 1.6, 1.2, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0, -2.0, -3.0, -4.0])
TEMPERATURE, TOP_P = 1.5, 0.96


def fixed_logits_counts(temperature: float, top_p: float, keys: int = 2000, positions: int = 10) -> torch.Tensor:
    """Token counts of ``keys`` x ``positions`` coupled draws (20k by default) from ``LOGITS``."""
    processors = coupled.coupled_logits_processors(temperature, top_p, range(keys), prompt_width=0)
    draws = [processors(torch.zeros(keys, t, dtype=torch.long), LOGITS.repeat(keys, 1)).argmax(-1)
             for t in range(positions)]
    return torch.bincount(torch.cat(draws), minlength=len(LOGITS)).double()


def test_token_frequencies_match_the_nucleus_softmax():
    probs = nucleus_probs(LOGITS, TEMPERATURE, TOP_P)
    assert (probs == 0).sum() == 3  # the top-p cut drops the three least likely tokens
    counts = fixed_logits_counts(TEMPERATURE, TOP_P)
    assert counts[probs == 0].sum() == 0  # truncation respected
    assert chi_square_p_value(counts, probs) > P_VALUE


@pytest.mark.parametrize("wrong", ["uniform noise", "no temperature", "no top-p"])
def test_the_frequency_check_fails_a_wrong_sampler(monkeypatch, wrong):
    temperature, top_p = {"no temperature": (1.0, TOP_P), "no top-p": (TEMPERATURE, 1.0)}.get(
        wrong, (TEMPERATURE, TOP_P))
    if wrong == "uniform noise":  # U itself in place of -log(-log U)
        gumbel = coupled.gumbel_noise
        monkeypatch.setattr(coupled, "gumbel_noise", lambda *a: (-gumbel(*a)).exp().neg().exp())
    counts = fixed_logits_counts(temperature, top_p)
    assert chi_square_p_value(counts, nucleus_probs(LOGITS, TEMPERATURE, TOP_P)) < P_VALUE


class TokenIdsBackend(TransformersBackend):
    """The transformers backend returning each completion's token ids (the byte-level texts of single tokens
    collide)."""

    def _to_generation(self, ids):
        return tuple(ids)


def test_tiny_model_first_token_frequencies_match_its_softmax():
    """20k first tokens of one prompt through ``generate`` (temperature and top-p warpers, row keys) against the
    model's own next-token distribution."""
    model, tokenizer = build_tiny_model(seed=0)
    ids = tokenize_prompt(tokenizer, "What is 3 + 4?")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    temperature, top_p = 0.5, 0.8
    probs = nucleus_probs(logits, temperature, top_p)
    assert 0 < (probs == 0).sum() < len(probs) - 50  # a real cut, with many tokens left
    backend = TokenIdsBackend(model, tokenizer, SamplingSettings(temperature, top_p, max_tokens=1, sampler="coupled"))
    draws = [g[0] for g in backend.generate([ids], 20_000, seed=0)[0]]
    counts = torch.bincount(torch.tensor(draws), minlength=len(probs)).double()
    assert chi_square_p_value(counts, probs) > P_VALUE


PROMPTS = ["Hello there", "What is 2+2?", "abc", "Write a long story about", "x", "Say the letter q:"]


def test_completions_do_not_depend_on_the_batch_and_repeat_across_calls():
    model, tokenizer = build_tiny_model(seed=0)
    backend = TransformersBackend(model, tokenizer, SamplingSettings(1.0, 0.9, max_tokens=12, sampler="coupled"))
    ids = [tokenize_prompt(tokenizer, p) for p in PROMPTS]
    alone = [backend.generate([one], 3, seed=7)[0] for one in ids]
    assert backend.generate(ids, 3, seed=7) == alone  # one batch, other padding and companions
    assert backend.generate(ids[::-1], 3, seed=7)[::-1] == alone  # another order
    assert backend.generate(ids[1:4], 3, seed=7) == alone[1:4]
    assert backend.generate(ids, 3, seed=8) != alone  # the seed matters
    assert len({g.text for per_prompt in alone for g in per_prompt}) == 18  # every sample its own noise


def test_runner_samples_do_not_depend_on_batch_size_and_resume_with_another(tmp_path):
    model, tokenizer = build_tiny_model(seed=0)
    backend = TransformersBackend(model, tokenizer, SamplingSettings(1.0, max_tokens=8, sampler="coupled"))
    dataset = toy_dataset(7, seed=3)
    runs = {size: sample_benchmark(Benchmark("toy", dataset, toy_reward), backend, 2, [0, 1], size, progress=False)
            for size in (1, 3, 7)}
    by_problem = {size: sorted((r["index"], r["seed"], json.dumps(r["samples"])) for r in records)
                  for size, records in runs.items()}
    assert by_problem[1] == by_problem[3] == by_problem[7]
    shuffled = Benchmark("toy", dataset.select([6, 2, 4, 0, 1, 5, 3]), toy_reward)
    records = sample_benchmark(shuffled, backend, 2, [0, 1], 3, progress=False)
    assert sorted((r["prompt"], r["seed"], json.dumps(r["samples"])) for r in records) == sorted(
        (r["prompt"], r["seed"], json.dumps(r["samples"])) for r in runs[3])

    def config(name, batch_size):
        return EvalConfig(model_name_or_path="tiny", benchmarks=["toy"], limit=7, k=4, seeds=[0, 1], max_tokens=8,
                          batch_size=batch_size, backend="transformers", sampler="coupled",
                          output_dir=str(tmp_path / name))

    full = evaluate(config("full", 7), backend=backend, progress=False)
    evaluate(config("resumed", 2), backend=backend, progress=False)
    samples = tmp_path / "resumed" / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:5]))  # cut after 5 of its 14 records
    resumed = evaluate(config("resumed", 3), backend=backend, progress=False)
    problems = [json.loads((tmp_path / name / "results.json").read_text())["problems"] for name in ("full", "resumed")]
    assert problems[0] == problems[1] and resumed["metrics"] == full["metrics"]


def agreement(first: list[list], second: list[list]) -> float:
    """The fraction of samples whose completions are identical."""
    pairs = [(a, b) for x, y in zip(first, second) for a, b in zip(x, y)]
    return sum(a == b for a, b in pairs) / len(pairs)


def test_two_close_models_agree_far_more_often_under_the_coupled_sampler():
    """A model and a copy with each weight moved by a tenth of its tensor's scale (the tiny model's next-token
    distributions are nearly uniform, so smaller moves change no sample), each sampling 6 prompts x 16 samples: the
    coupled sampler draws the same noise for both in any batch layout. The multinomial sampler couples them only
    when both make the same calls with the same seed (torch's one-sample multinomial is an exponential race over
    the call's own stream, so it is keyed by row and step): with the problems batched otherwise, its samples are
    independent."""
    model, tokenizer = build_tiny_model(seed=0)
    close, _ = build_tiny_model(seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in close.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1 * parameter.std())
    ids = [tokenize_prompt(tokenizer, p) for p in PROMPTS]

    def samples(m, sampler, batch_size):
        backend = TransformersBackend(m, tokenizer, SamplingSettings(1.0, max_tokens=10, sampler=sampler))
        return [s for start in range(0, len(ids), batch_size) for s in backend.generate(ids[start:start + batch_size],
                                                                                         16, seed=0)]

    coupled_same_calls = agreement(samples(model, "coupled", 6), samples(close, "coupled", 6))
    coupled_other_batches = agreement(samples(model, "coupled", 6), samples(close, "coupled", 2))
    multinomial_same_calls = agreement(samples(model, "multinomial", 6), samples(close, "multinomial", 6))
    multinomial_other_batches = agreement(samples(model, "multinomial", 6), samples(close, "multinomial", 2))
    assert 0.5 < coupled_other_batches == coupled_same_calls < 1  # the models differ; the batches do not matter
    assert multinomial_other_batches < 0.05
    assert abs(multinomial_same_calls - coupled_same_calls) < 0.2


def test_greedy_decoding_is_unchanged():
    model, tokenizer = build_tiny_model(seed=0)
    ids = [tokenize_prompt(tokenizer, p) for p in PROMPTS]
    outputs = [TransformersBackend(model, tokenizer, SamplingSettings(0.0, max_tokens=10, sampler=s)).generate(ids, 2, 0)
               for s in ("multinomial", "coupled")]
    assert outputs[0] == outputs[1]


def test_the_sampler_field_is_checked_and_vllm_refuses_coupled():
    with pytest.raises(ValueError, match=r"EvalConfig.sampler='gumbel': use one of \('multinomial', 'coupled'\)"):
        EvalConfig(model_name_or_path="m", sampler="gumbel")
    with pytest.raises(ValueError, match="EvalConfig.sampler='coupled' needs the transformers backend"):
        EvalConfig(model_name_or_path="m", sampler="coupled", backend="vllm")
    from acpo_trl.evaluation.generation import VLLMBackend

    with pytest.raises(ValueError, match="sampler='coupled' needs the transformers backend"):
        VLLMBackend("m", None, SamplingSettings(sampler="coupled"))
