"""Δlog p toolkit: metrics, scoring, selection, sampling, two-model decoding, analysis, CLI (tiny local models)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from acpo_trl.dlogp import (
    DecodeConfig,
    candidate_probs,
    eos_token_ids,
    sample_candidates,
    score_responses,
    select,
    single_model_generate,
    token_metrics,
    top_p_filter,
    two_model_generate,
)
from acpo_trl.dlogp.analysis import mass_share, summary, top_tokens, write_analysis
from acpo_trl.utils.tiny_models import build_tiny_model

FIXTURES = Path(__file__).parent / "fixtures"


def _log(probs):
    return torch.tensor(probs, dtype=torch.float64).log().unsqueeze(0)


@pytest.fixture(scope="module")
def pair():
    """A tiny base model, an identical copy and a different model (same tokenizer), plus prompts."""
    base, tokenizer = build_tiny_model(seed=0)
    other, _ = build_tiny_model(seed=1)
    prompts = [
        list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        for t in ("Write the letter a:", "hi", "What is 2 + 3?")
    ]  # fmt: skip
    return base.eval(), copy.deepcopy(base).eval(), other.eval(), tokenizer, prompts


def _decode_kwargs(tokenizer, seed, eos=None):
    return dict(
        eos_ids=eos if eos is not None else [tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(seed),
    )


# --- metrics -------------------------------------------------------------------------------------------------


def test_metrics_on_hand_built_distributions():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    m = token_metrics(_log(p), _log(q), torch.tensor([2]))
    kl_pq = sum(a * math.log(a / b) for a, b in zip(p, q))
    kl_qp = sum(b * math.log(b / a) for a, b in zip(p, q))
    assert m["dlogp"].item() == pytest.approx(math.log(0.2 / 0.6))
    assert m["entropy_rl"].item() == pytest.approx(-sum(a * math.log(a) for a in p))
    assert m["entropy_base"].item() == pytest.approx(-sum(b * math.log(b) for b in q))
    assert m["kl_rl_base"].item() == pytest.approx(kl_pq)
    assert m["kl_base_rl"].item() == pytest.approx(kl_qp)
    assert m["kl_sym"].item() == pytest.approx((kl_pq + kl_qp) / 2)


def test_top_k_emulation_matches_a_hand_computed_padded_case():
    rl = [0.5, 0.3, 0.1, 0.06, 0.04]  # top-2 {0, 1}, pad 0.3
    base = [0.1, 0.12, 0.25, 0.45, 0.08]  # top-2 {3, 2}, pad 0.25
    tokens = torch.tensor([0, 3, 4])
    m = token_metrics(_log(rl).expand(3, -1), _log(base).expand(3, -1), tokens, top_k=2)
    # Δlog p with each missing log-prob padded by the minimum of that model's top-2.
    assert m["dlogp"].tolist() == pytest.approx([math.log(0.5 / 0.25), math.log(0.3 / 0.45), math.log(0.3 / 0.25)])
    # Entropies over each model's own top-2, renormalised.
    h = lambda ps: -sum(x / sum(ps) * math.log(x / sum(ps)) for x in ps)  # noqa: E731
    assert m["entropy_rl"][0].item() == pytest.approx(h([0.5, 0.3]))
    assert m["entropy_base"][0].item() == pytest.approx(h([0.45, 0.25]))
    # KLs over the union {0, 1, 2, 3} of the top-2 sets, padded and renormalised (token 4 is outside both).
    p = [x / 1.4 for x in (0.5, 0.3, 0.3, 0.3)]
    q = [x / 1.2 for x in (0.25, 0.25, 0.25, 0.45)]
    kl_pq = sum(a * math.log(a / b) for a, b in zip(p, q))
    kl_qp = sum(b * math.log(b / a) for a, b in zip(p, q))
    assert m["kl_rl_base"][0].item() == pytest.approx(kl_pq)
    assert m["kl_base_rl"][0].item() == pytest.approx(kl_qp)
    assert m["kl_sym"][0].item() == pytest.approx((kl_pq + kl_qp) / 2)


def test_metric_errors_name_the_field():
    with pytest.raises(ValueError, match="share a tokenizer"):
        token_metrics(torch.zeros(1, 3), torch.zeros(1, 4), torch.tensor([0]))
    with pytest.raises(ValueError, match="`names`"):
        token_metrics(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([0]), names=("kl",))
    with pytest.raises(ValueError, match="top_k=9"):
        token_metrics(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([0]), top_k=9)


# --- teacher-forced scoring ----------------------------------------------------------------------------------


def test_identical_models_give_zero_dlogp_and_kl_everywhere(pair):
    base, same, _, tokenizer, prompts = pair
    out = single_model_generate(base, prompts, max_new_tokens=12, **_decode_kwargs(tokenizer, 0))
    assert sum(len(r) for r in out.responses) > 10
    for top_k in (None, 5):
        for m in score_responses(base, same, prompts, out.responses, batch_size=2, chunk_tokens=5, top_k=top_k):
            assert torch.equal(m["dlogp"], torch.zeros_like(m["dlogp"]))
            for name in ("kl_rl_base", "kl_base_rl", "kl_sym"):
                assert m[name].abs().max() < 1e-6
            assert torch.equal(m["entropy_rl"], m["entropy_base"]) and (m["entropy_rl"] > 0).all()


def test_chunked_batched_scoring_matches_full_forward(pair):
    base, _, other, tokenizer, prompts = pair
    responses = [tokenizer("xyz abc", add_special_tokens=False)["input_ids"], [], tokenizer("5<|im_end|>")["input_ids"]]
    scores = score_responses(base, other, prompts, responses, batch_size=2, chunk_tokens=3)
    assert scores[1]["dlogp"].numel() == 0
    with torch.no_grad():
        for prompt, response, got in zip(prompts, responses, scores):
            if not response:
                continue
            ids = torch.tensor([prompt + response])
            at = slice(len(prompt) - 1, len(prompt) + len(response) - 1)
            lp_base = torch.log_softmax(base(ids).logits[0, at].float(), -1)
            lp_rl = torch.log_softmax(other(ids).logits[0, at].float(), -1)
            want = token_metrics(lp_rl, lp_base, torch.tensor(response))
            for name, value in want.items():
                torch.testing.assert_close(got[name], value, atol=2e-5, rtol=1e-4)


def test_scoring_rejects_mismatched_inputs(pair):
    base, same, _, _, prompts = pair
    with pytest.raises(ValueError, match="one response per prompt"):
        score_responses(base, same, prompts, [[1]])
    with pytest.raises(ValueError, match="empty prompt"):
        score_responses(base, same, [[]], [[1]])


# --- selection and sampling ------------------------------------------------------------------------------------


def test_selectors_apply_their_thresholds():
    rl = torch.tensor([[0.7, 0.2, 0.1], [1 / 3] * 3], dtype=torch.float64).log()
    base = torch.tensor([[0.1, 0.2, 0.7], [1 / 3] * 3], dtype=torch.float64).log()
    tokens = torch.tensor([2, 0])  # Δlog p = log(0.1/0.7) ≈ -1.95, then 0
    assert select("dlogp", -0.3, rl, base, tokens).tolist() == [True, False]
    assert select("entropy", 1.0, rl, base, tokens).tolist() == [False, True]  # H(base) ≈ 0.80, then log 3
    assert select("kl", 0.5, rl, base, tokens).tolist() == [True, False]  # KL(rl‖base) ≈ 1.17, then 0
    assert select("all", 0.0, rl, base, tokens).tolist() == [True, True]
    assert select("none", 0.0, rl, base, tokens).tolist() == [False, False]
    many = torch.zeros(20000, dtype=torch.long)
    rate = select("random", 0.2, rl[:1].expand(20000, -1), base[:1].expand(20000, -1), many, torch.Generator().manual_seed(0))
    assert rate.float().mean().item() == pytest.approx(0.2, abs=0.01)
    with pytest.raises(ValueError, match="`criterion` must be one of"):
        select("margin", 0.0, rl, base, tokens)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    logits = _log([0.5, 0.3, 0.15, 0.05])
    kept = torch.isfinite(top_p_filter(logits, 0.7))[0].tolist()
    assert kept == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.1))[0].tolist() == [True, False, False, False]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_extrapolated_distribution_equals_the_closed_form():
    p_rl, p_base = [0.05, 0.4, 0.3, 0.2, 0.05], [0.3, 0.1, 0.25, 0.25, 0.1]
    candidates = torch.tensor([[0, 2, 3, 1]])  # a base top-4 (order irrelevant)
    gamma, temperature = 0.5, 0.8
    got = candidate_probs(_log(p_rl), _log(p_base), candidates, gamma, temperature, top_p=1.0)[0]
    # π_Extra ∝ (π_RL^{1+γ} π_base^{-γ})^{1/T} over the candidates.
    weights = [(p_rl[c] ** (1 + gamma) * p_base[c] ** (-gamma)) ** (1 / temperature) for c in candidates[0].tolist()]
    assert got.tolist() == pytest.approx([w / sum(weights) for w in weights])
    # top-p on the extrapolated distribution ≈ [0.007, 0.220, 0.103, 0.670]: p = 0.8 keeps the two largest.
    nucleus = candidate_probs(_log(p_rl), _log(p_base), candidates, gamma, temperature, top_p=0.8)[0]
    kept = [w for i, w in enumerate(weights) if i in (1, 3)]
    assert nucleus.tolist() == pytest.approx([0.0, kept[0] / sum(kept), 0.0, kept[1] / sum(kept)])


def test_gamma_zero_samples_the_rl_distribution_restricted_to_the_candidates():
    p_rl, p_base = [0.3, 0.25, 0.2, 0.15, 0.1], [0.1, 0.4, 0.05, 0.3, 0.15]
    n = 40000
    candidates = torch.tensor([[1, 3, 4]]).expand(n, -1)  # base top-3
    draws = sample_candidates(
        _log(p_rl).expand(n, -1), _log(p_base).expand(n, -1), candidates, 0.0, 1.0, 1.0, torch.Generator().manual_seed(0)
    )
    freq = torch.bincount(draws, minlength=5).double() / n
    mass = p_rl[1] + p_rl[3] + p_rl[4]
    assert freq[[0, 2]].tolist() == [0.0, 0.0]  # never outside the candidates
    assert freq[[1, 3, 4]].tolist() == pytest.approx([p_rl[1] / mass, p_rl[3] / mass, p_rl[4] / mass], abs=0.01)


# --- two-model decoding ---------------------------------------------------------------------------------------


def test_identical_models_select_nothing_and_decode_as_the_base_model(pair):
    base, same, _, tokenizer, prompts = pair
    reference = single_model_generate(base, prompts, top_p=0.9, max_new_tokens=16, **_decode_kwargs(tokenizer, 3))
    for criterion, tau in (("dlogp", -1e-4), ("kl", 1e-4), ("none", 0.0)):
        config = DecodeConfig(criterion=criterion, tau=tau, top_p=0.9, max_new_tokens=16)
        out = two_model_generate(base, same, prompts, config, **_decode_kwargs(tokenizer, 3))
        assert out.replacement_ratios == [0.0, 0.0, 0.0]
        assert out.responses == reference.responses
    assert len({tuple(r) for r in reference.responses}) == 3


def test_decoding_agrees_with_teacher_forced_scoring(pair):
    """A kept base token has Δlog p > τ when re-scored teacher-forced (KV-cache decoding = full forward)."""
    base, _, other, tokenizer, prompts = pair
    config = DecodeConfig(criterion="dlogp", tau=0.0, max_new_tokens=20)
    out = two_model_generate(base, other, prompts, config, **_decode_kwargs(tokenizer, 1))
    scores = score_responses(base, other, prompts, out.responses)
    kept = torch.cat([m["dlogp"][~torch.tensor(s)] for m, s in zip(scores, out.selected)])
    assert kept.numel() > 5 and (kept > -1e-5).all()
    ratio = sum(map(sum, out.selected)) / sum(map(len, out.selected))
    assert 0.05 < ratio < 0.95 and out.replacement_ratios == [sum(s) / len(s) for s in out.selected]


def test_nonselective_variant_and_responses_stop_at_the_first_eos(pair):
    base, _, other, tokenizer, prompts = pair
    eos = list(range(120, 180))  # frequent byte tokens stand in for the end-of-turn token
    config = DecodeConfig(criterion="all", driver="rl", gamma=0.05, top_k=20, max_new_tokens=40)
    out = two_model_generate(base, other, prompts, config, **_decode_kwargs(tokenizer, 0, eos))
    assert out.replacement_ratios == [1.0, 1.0, 1.0]
    for response in out.responses:
        ends = [i for i, t in enumerate(response) if t in eos]
        assert ends and ends[0] == len(response) - 1  # kept, and nothing after it
    assert len({len(r) for r in out.responses}) > 1


def test_decode_config_errors_name_the_field():
    for kwargs, message in (
        ({"criterion": "margin"}, "`criterion` must be one of"),
        ({"driver": "rl"}, 'criterion="all"'),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_k": 0}, "top_k=0"),
    ):
        with pytest.raises(ValueError, match=message):
            DecodeConfig(**kwargs)


def test_run_settings_derive_each_methods_decoding_from_one_config():
    from acpo_trl.dlogp.runs import RunSettings

    settings = RunSettings()  # the paper's protocol
    assert (settings.decode.top_p, settings.decode.temperature, settings.decode.tau) == (0.7, 1.0, -0.3)
    assert settings.decode_config("replace") == settings.decode_config("base") == DecodeConfig(
        top_p=0.7, max_new_tokens=1024)  # gamma 0: the RL distribution at selected positions
    assert settings.decode_config("extrapolate").gamma == 0.1
    nonselective = settings.decode_config("nonselective")
    assert (nonselective.driver, nonselective.criterion, nonselective.gamma) == ("rl", "all", 0.1)
    with pytest.raises(ValueError, match="methods must be taken from"):
        settings.decode_config("beam")
    with pytest.raises(ValueError, match="RunSettings.decode.driver"):
        RunSettings(decode=DecodeConfig(criterion="all", driver="rl"))
    with pytest.raises(ValueError, match="k=0"):
        RunSettings(k=0)


def test_eos_ids_follow_the_tokenizer_and_generation_config(pair):
    base, _, _, tokenizer, _ = pair
    base.generation_config.eos_token_id = [tokenizer.eos_token_id, 1]
    try:
        assert eos_token_ids(tokenizer, base) == sorted({tokenizer.eos_token_id, 1})
    finally:
        base.generation_config.eos_token_id = tokenizer.eos_token_id


# --- analysis ------------------------------------------------------------------------------------------------


def _records():
    return [
        {"source": "rl", "tokens": ["a", "b", "c", "d"], "dlogp": [2.0, 0.0, 0.0, 0.1], "prompt_index": 0},
        {"source": "base", "tokens": ["e", "f"], "dlogp": [-1.0, 0.05], "prompt_index": 0},
    ]


def _with_all_metrics(records):
    for r in records:
        for name in ("entropy_rl", "entropy_base", "kl_rl_base", "kl_base_rl", "kl_sym"):
            r[name] = [abs(v) for v in r["dlogp"]]
    return records


def test_summary_and_sparsity_figures():
    assert mass_share([2.0, 0.0, 0.0, 0.1], 0.5) == 0.25  # one token of four carries half of Σ|v|
    assert mass_share([1.0, 1.0], 0.9) == 1.0 and mass_share([0.0], 0.5) == 0.0
    stats = summary(_with_all_metrics(_records()))
    assert stats["rl"]["dlogp"]["frac_abs_gt_0.5"] == 0.25 and stats["rl"]["dlogp"]["frac_positive"] == 0.5
    assert stats["base"]["dlogp"]["mean"] == pytest.approx(-0.475)
    assert stats["base"]["dlogp"]["num_tokens"] == 2


def test_top_tokens_and_written_outputs(tmp_path):
    records = _with_all_metrics(_records())
    top = top_tokens(records, n=2)
    assert [t["token"] for t in top["highest"]] == ["a", "d"] and top["lowest"][0]["token"] == "e"
    assert top["highest"][1]["context"] == "abc"
    files = write_analysis(records, tmp_path)
    assert json.loads(files["tokens"].read_text()) == records
    assert json.loads(files["summary"].read_text())["rl"]["kl_sym"]["num_tokens"] == 4
    pngs = sorted(p.name for p in tmp_path.glob("hist_*.png"))
    assert len(pngs) == 6 and all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


# --- command line ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_generate_and_score_on_saved_tiny_models(tmp_path, capsys):
    from acpo_trl.dlogp.cli import main
    from acpo_trl.evaluation.cli import main as eval_main

    for name, seed in (("base", 0), ("rl", 1)):
        model, tokenizer = build_tiny_model(seed=seed)
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    spec = f"math500={FIXTURES / 'math' / 'math500.jsonl'}"
    common = ["--base", str(tmp_path / "base"), "--rl", str(tmp_path / "rl"), "--benchmark", spec, "--limit", "2",
              "--k", "2", "--max_new_tokens", "6", "--device", "cpu"]  # fmt: skip
    main(["generate", *common, "--methods", "base", "replace", "nonselective", "--tau", "0.0",
          "--out_dir", str(tmp_path / "gen")])  # fmt: skip
    assert "| replace | 0.00 |" in capsys.readouterr().out
    result = json.loads((tmp_path / "gen" / "results.json").read_text())
    assert result["metrics"]["base"]["replaced_pct"] == 0.0 and result["metrics"]["nonselective"]["replaced_pct"] == 100
    assert 0 < result["metrics"]["replace"]["replaced_pct"] < 100
    samples = json.loads((tmp_path / "gen" / "samples.json").read_text())
    assert len(samples) == 12 and {"prompt", "completion", "score", "replacement_ratio"} <= set(samples[0])

    eval_main(["--model_name_or_path", str(tmp_path / "rl"), "--benchmarks", spec, "--limit", "2", "--k", "2",
               "--max_tokens", "6", "--backend", "transformers", "--device", "cpu", "--template", "chat",
               "--output_dir", str(tmp_path / "eval_rl")])  # fmt: skip
    main(["score", *common, "--responses", f"rl={tmp_path / 'eval_rl'}", "--emulate_top_k", "50",
          "--out_dir", str(tmp_path / "score")])  # fmt: skip
    tokens = json.loads((tmp_path / "score" / "tokens.json").read_text())
    assert len(tokens) == 4 and {r["source"] for r in tokens} == {"rl"}
    assert (tmp_path / "score" / "hist_dlogp.png").is_file()
    main(["score", *common, "--out_dir", str(tmp_path / "score2")])  # responses sampled from both models
    assert {r["source"] for r in json.loads((tmp_path / "score2" / "tokens.json").read_text())} == {"rl", "base"}
    with pytest.raises(SystemExit) as exit_info:
        main(["score", *common, "--responses", "nowhere", "--out_dir", str(tmp_path / "x")])
    assert exit_info.value.code == 2 and "SOURCE=PATH" in capsys.readouterr().err
