"""Diagnostics: per-bin ratio statistics agree with ACPO's own bins and eps, clip masks of the methods, log-ratio
shape, gradient angle / norm ratio / per-bin shares, update index, plots."""

from __future__ import annotations

import math

import pytest
import torch


def _config(**overrides):
    from acpo_trl.config import config_defaults

    return config_defaults(**{"max_completion_length": None, **overrides})


def _batch(seed=0, b=16, t=24, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    logps = torch.log(torch.rand(b, t, generator=g).clamp(min=1e-3))
    old = logps + spread * torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.1).float()
    adv = torch.randn(b, 1, generator=g)
    return logps, old, mask, adv


def _values(metrics):
    """name -> num / den; a 1-dim pair named ``"...{}..."`` is one metric per element (vectorised metrics)."""
    out = {}
    for name, (num, den) in metrics.items():
        num, den = num.double().reshape(-1), den.double().reshape(-1).expand(num.numel())
        names = [name] if num.numel() == 1 and "{}" not in name else [name.format(i) for i in range(num.numel())]
        out.update({n: (float(a) / float(b) if float(b) > 0 else math.nan) for n, a, b in zip(names, num, den)})
    return out


def test_eps_and_clip_fractions_match_acpos_own_metrics():
    from acpo_trl.diagnostics import ratio_diagnostics
    from acpo_trl.losses import BinClipRule, PolicyLossInputs, get_policy_loss

    logps, old, mask, adv = _batch()
    config = _config()
    inputs = PolicyLossInputs(logps=logps, old_logps=old, advantages=adv, mask=mask)
    out = get_policy_loss("acpo")(inputs, config)
    own = _values(out.metrics)
    diag = _values(ratio_diagnostics(logps, old, mask, adv, rule=BinClipRule.from_config(config),
                                     clipped_high=out.clipped_high, clipped_low=out.clipped_low, k=3))
    for b in range(5):
        assert diag[f"diag/k3/bin{b}/acpo_eps"] == pytest.approx(own[f"acpo/bin{b}/eps"], rel=1e-5, nan_ok=True)
        assert diag[f"diag/k3/bin{b}/token_frac"] == pytest.approx(own[f"acpo/bin{b}/token_frac"])
        for sign in ("pos", "neg"):
            mine, theirs = diag[f"diag/k3/bin{b}/clip_frac_{sign}"], own[f"acpo/bin{b}/clip_frac_{sign}"]
            assert mine == pytest.approx(theirs, nan_ok=True)
            assert diag[f"diag/k3/bin{b}/acpo_clip_frac_{sign}"] == pytest.approx(theirs, nan_ok=True)
    assert sum(diag[f"diag/k3/bin{b}/token_frac"] for b in range(5)) == pytest.approx(1.0)


def test_moved_fraction_counts_tokens_with_an_advantage_outside_grpos_clip():
    """moved_frac: of a bin's tokens with A != 0, those whose ratio left [0.8, 1.2]; A = 0 tokens and masked ones do
    not count (no clip acts on them)."""
    from acpo_trl.diagnostics import ratio_diagnostics
    from acpo_trl.losses import BinClipRule

    logps = torch.log(torch.full((3, 4), 0.9))  # every token in the top bin
    ratio = torch.tensor([[1.0, 1.19, 0.81, 1.3], [0.7, 1.0, 1.0, 1.0], [2.0, 0.5, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    adv = torch.tensor([[1.0], [-1.0], [0.0]])
    diag = _values(ratio_diagnostics(logps, logps - ratio.log(), mask, adv, rule=BinClipRule(num_bins=1), k=1))
    assert diag["diag/k1/bin0/moved_frac"] == pytest.approx(2 / 7)  # 1.3 (A > 0) and 0.7 (A < 0) of 7 tokens
    on_policy = _values(ratio_diagnostics(logps, logps.clone(), mask, adv, k=0))
    moved = [on_policy[f"diag/k0/bin{b}/moved_frac"] for b in range(5)]
    assert all(value == 0.0 or math.isnan(value) for value in moved)  # NaN: a bin without tokens


def test_on_policy_batch_has_base_eps_no_clipping_and_no_shape_statistics():
    from acpo_trl.diagnostics import ratio_diagnostics

    logps, _, mask, adv = _batch()
    diag = _values(ratio_diagnostics(logps, logps.clone(), mask, adv, k=0))
    for b in range(5):
        assert diag[f"diag/k0/bin{b}/acpo_eps"] == pytest.approx(0.2, abs=1e-3)
        assert diag[f"diag/k0/bin{b}/ratio_mean"] == pytest.approx(1.0)
        assert diag[f"diag/k0/bin{b}/acpo_clip_frac_pos"] == 0.0
        assert math.isnan(diag[f"diag/k0/bin{b}/logratio_skew"])  # no dispersion: shape undefined, not logged


def test_log_normal_ratio_has_zero_skew_and_excess_kurtosis_and_skewed_one_does_not():
    from acpo_trl.diagnostics import ratio_diagnostics

    g = torch.Generator().manual_seed(1)
    n = 40000
    logps = torch.full((1, n), math.log(0.9))  # all in bin 4
    mask, adv = torch.ones(1, n), torch.ones(1, 1)
    x = 0.3 * torch.randn(1, n, generator=g)
    diag = _values(ratio_diagnostics(logps, logps - x, mask, adv))
    assert abs(diag["diag/bin4/logratio_skew"]) < 0.05 and abs(diag["diag/bin4/logratio_kurt"]) < 0.1
    assert diag["diag/bin4/logratio_std"] == pytest.approx(0.3, rel=0.02)
    skewed = _values(ratio_diagnostics(logps, logps - x.abs(), mask, adv))  # half-normal log-ratio
    assert skewed["diag/bin4/logratio_skew"] > 0.9


@pytest.mark.parametrize("method,low,high", [("dapo", 0.2, 0.28), ("ppo_clip", 0.2, 0.2), ("ar_lopti", 0.2, 0.24),
                                             ("dominate", 0.2, 0.28), ("masked_cispo", 0.2, 0.3),
                                             ("high_entropy", 0.2, 0.28), ("low_entropy", 0.2, 0.28)])
def test_each_loss_returns_its_clip_masks(method, low, high):
    """The diagnostics read the masks the loss returns: each method's own trust region, at its range with TRL's
    epsilon and an unset epsilon_high (masked_cispo: the tokens its (0.8, 1.3) mask drops; a reweighting: its base
    objective's, here dapo)."""
    from acpo_trl.losses import PolicyLossInputs, get_policy_loss

    logps, old, mask, adv = _batch(spread=0.5)
    inputs = PolicyLossInputs(logps=logps, old_logps=old, advantages=adv, mask=mask, update_pass=0,
                              entropies=torch.rand(logps.shape), logppl_z=torch.zeros(logps.size(0)))
    out = get_policy_loss(method)(inputs, _config(entropy_token_fraction=0.2, ar_weight_c=0.3, lopti_prob_threshold=0.5,
                                                  ppl_clamp=False))
    r = torch.exp(logps - old)
    assert torch.equal(out.clipped_high, (r > 1 + high) & (adv > 0))
    assert torch.equal(out.clipped_low, (r < 1 - low) & (adv < 0))


def _tiny_policy(seed=0, b=8, t=10, vocab=6, dim=5):
    g = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(vocab, dim, generator=g))
    hidden = torch.randn(b, t, dim, generator=g)
    tokens = torch.randint(vocab, (b, t), generator=g)
    logps = torch.log_softmax(hidden @ weight.T, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    adv = torch.randn(b, 1, generator=g)
    return weight, logps, adv, torch.ones(b, t)


def test_gradient_angle_is_zero_without_clipping_and_shares_sum_to_one():
    from acpo_trl.diagnostics import gradient_diagnostics
    from acpo_trl.losses import PolicyLossInputs, get_policy_loss

    weight, logps, adv, mask = _tiny_policy()
    out = get_policy_loss("ppo_clip")(PolicyLossInputs(logps, logps.detach(), adv, mask), _config())
    diag = _values(gradient_diagnostics(out.per_token_loss, logps, logps.detach(), adv, mask, [weight]))
    assert diag["grad/angle_deg"] == pytest.approx(0.0, abs=1e-2) and diag["grad/norm_ratio"] == pytest.approx(1.0)
    shares = [v for k, v in diag.items() if k.startswith("grad/share/")]
    assert len(shares) == 10 and sum(shares) == pytest.approx(1.0, abs=1e-5)
    assert weight.grad is None  # the training gradient is untouched


def test_clipping_rotates_the_gradient():
    from acpo_trl.diagnostics import gradient_diagnostics
    from acpo_trl.losses import PolicyLossInputs, get_policy_loss

    weight, logps, adv, mask = _tiny_policy(seed=3)
    old = logps.detach() + 0.5 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(0))
    out = get_policy_loss("dapo")(PolicyLossInputs(logps, old, adv, mask), _config())
    diag = _values(gradient_diagnostics(out.per_token_loss, logps, old, adv, mask, [weight], per_group=False))
    assert 1.0 < diag["grad/angle_deg"] < 180.0 and "grad/share/bin0/pos" not in diag


def test_gradient_diagnostics_emit_the_same_names_whatever_the_data():
    """All-zero advantages (a micro-batch of equal rewards) give a zero gradient: the undefined angle, norm ratio
    and shares are still emitted, as (0, 0) pairs (missing), so processes reduce identical name lists."""
    from acpo_trl.diagnostics import gradient_diagnostics
    from acpo_trl.losses import PolicyLossInputs, get_policy_loss

    weight, logps, adv, mask = _tiny_policy()
    names = {}
    for label, advantages in (("normal", adv), ("zero", torch.zeros_like(adv))):
        out = get_policy_loss("dapo")(PolicyLossInputs(logps, logps.detach(), advantages, mask), _config())
        names[label] = list(gradient_diagnostics(out.per_token_loss, logps, logps.detach(), advantages, mask, [weight]))
    assert names["normal"] == names["zero"] and len(names["zero"]) == 5 + 20
    out = get_policy_loss("dapo")(PolicyLossInputs(logps, logps.detach(), torch.zeros_like(adv), mask), _config())
    zero = _values(gradient_diagnostics(out.per_token_loss, logps, logps.detach(), torch.zeros_like(adv), mask, [weight]))
    assert math.isnan(zero["grad/angle_deg"]) and math.isnan(zero["grad/share/bin0/pos"])
    assert zero["grad/norm_used"] == 0.0


def test_update_index_and_parameter_subset():
    from acpo_trl.diagnostics import gradient_step_due, select_parameters, update_index
    from acpo_trl.utils.tiny_models import build_tiny_model

    assert [update_index(s, 4, 1, 1) for s in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [update_index(s, 4, 1, 2) for s in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [update_index(s, 2, 2, 1) for s in range(5)] == [0, 1, 2, 3, 0]  # two passes (ar_lopti)
    due = [s for s in range(80) if gradient_step_due(s, 10, 4)]
    assert due == [0, 11, 22, 33, 40, 51, 62, 73] and [s % 4 for s in due] == [0, 3, 2, 1, 0, 3, 2, 1]
    assert [s for s in range(30) if gradient_step_due(s, 10, 1)] == [0, 10, 20]
    model, _ = build_tiny_model()
    names = [n for n, _ in select_parameters(model, [r"layers\.1\."])]
    assert names and all("layers.1." in n for n in names)
    with pytest.raises(ValueError, match="No trainable parameter"):
        select_parameters(model, ["nothing-matches"])


def test_plots_from_logged_entries(tmp_path):
    from acpo_trl.diagnostics.plots import bin_table, plot_bins_vs_k, plot_gradient_diagnostics

    entries = [{"step": s, f"diag/k{s % 4}/bin{b}/acpo_eps": 0.2 + 0.1 * (s % 4) * (5 - b), "grad/angle_deg": 10.0 + s,
                "grad/norm_ratio": 0.9, f"grad/share/bin{b}/pos": 0.1, f"grad/share/bin{b}/neg": 0.1,
                f"diag/k{s % 4}/bin{b}/acpo_clip_frac_pos": 0.01, f"diag/k{s % 4}/bin{b}/acpo_clip_frac_neg": None}
               for s in range(1, 9) for b in range(5)]
    table = bin_table(entries)
    assert table["acpo_eps"][(0, 4)] == pytest.approx(0.2) and table["acpo_eps"][(2, 0)] == pytest.approx(1.2)
    for png in (plot_bins_vs_k(entries, str(tmp_path / "a.png")), plot_gradient_diagnostics(entries, str(tmp_path / "b.png"))):
        assert (tmp_path / png.split("/")[-1]).stat().st_size > 1000


def test_the_diagnostics_report_each_bin_clip_methods_own_ranges(tmp_path):
    """acpo, acpo_log and bin_clip report their own rule's eps (ratio / log-ratio / frozen), the other methods
    ACPO's; diagnostics_num_bins other than the method's K bins at that K with ACPO's rule (not the method's own);
    the rule is logged with the diagnostics and recorded in a run's summary."""
    from conftest import trainer_kwargs

    from acpo_trl import ACPOConfig
    from acpo_trl.diagnostics.hook import diagnostics_rule
    from acpo_trl.study.results import summarize_diagnostics

    def rule(**fields):
        return diagnostics_rule(ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=2, **fields)))

    own, is_own = rule(policy_loss="acpo", acpo_alpha=1.0)
    assert own.statistic == "ratio" and own.alpha == 1.0 and is_own
    assert rule(policy_loss="acpo_log")[0].statistic == "logratio"
    assert rule(policy_loss="dapo")[0].statistic == "ratio" and not rule(policy_loss="dapo")[1]  # what ACPO would set
    assert rule(policy_loss="dlogp_reweight", reweight_base_loss="acpo_log")[0].statistic == "logratio"
    frozen, is_own = rule(policy_loss="bin_clip", bin_clip_ranges=[0.4, 0.3, 0.2])
    assert (frozen.num_bins, frozen.alpha, frozen.base, is_own) == (3, 0.0, (0.4, 0.3, 0.2), True)
    one_bin, is_own = rule(policy_loss="acpo", acpo_num_bins=1, diagnostics_num_bins=5)
    assert (one_bin.num_bins, one_bin.alpha, is_own) == (5, 3.0, False)
    assert rule(policy_loss="acpo", diagnostics_num_bins=5)[1]  # the method's own K: its own rule
    entries = [{"step": 1, "diag/k0/bin0/acpo_eps": 0.2, "diag/eps_rule_logratio": 1.0}]
    assert summarize_diagnostics(entries)["eps_rule"] == "logratio"
    assert summarize_diagnostics([{"step": 1, "diag/k0/bin0/acpo_eps": 0.2}])["eps_rule"] == "ratio"


def test_run_summary_keeps_the_gradient_measures_per_update_index():
    """A run's summary keeps the angle and the gradient shares per update index k (which token group dominates
    late in a rollout) and over all k, skipping undefined values."""
    from acpo_trl.study.results import summarize_diagnostics

    entries = [{"step": 1, "grad/share/bin0/pos": 0.2, "grad/k0/share/bin0/pos": 0.2, "grad/angle_deg": 0.0,
                "grad/k0/angle_deg": 0.0},
               {"step": 2, "grad/share/bin0/pos": 0.6, "grad/k1/share/bin0/pos": 0.6, "grad/angle_deg": 8.0,
                "grad/k1/angle_deg": 8.0, "grad/k1/share/bin1/neg": float("nan")}]
    summary = summarize_diagnostics(entries)
    assert summary["grad_k"] == {"share/bin0/pos": {"0": 0.2, "1": 0.6}, "angle_deg": {"0": 0.0, "1": 8.0}}
    assert summary["grad"] == {"share/bin0/pos": pytest.approx(0.4), "angle_deg": 4.0}
