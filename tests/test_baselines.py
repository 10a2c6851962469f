"""The baselines of the ACPO and Δlog p papers: each rule pinned on hand-built tensors (expected values worked
out here from the equations), TRL's unmasked CISPO reproduced, the Lopti schedule, and a short off-policy
training run per method."""

from __future__ import annotations

import math

import pytest
import torch

from acpo_trl.losses import PolicyLossInputs, entropy_rank_mask, flatten_metrics, get_policy_loss
from conftest import trainer_kwargs

METHODS = ["dapo", "masked_cispo", "trl_cispo", "high_entropy", "low_entropy", "ar_lopti", "dlogp_reweight", "dominate",
           "ppl", "sapo", "vespo", "unclipped"]


def config(**overrides):
    """ACPOConfig's defaults at the ACPO authors' clip 0.2 / 0.3 (the values the rules below are worked out at)."""
    from acpo_trl.config import config_defaults

    return config_defaults(**{"epsilon_high": 0.3, **overrides})


def tokens(ratios, advantages, p_current=0.5, mask=None):
    """One token per row: given ratio r and advantage A; returns inputs with logps as a leaf."""
    r = torch.tensor(ratios)[:, None]
    logps = torch.full_like(r, math.log(p_current)).requires_grad_(True)
    old_logps = (logps.detach() - r.log())
    adv = torch.tensor(advantages)[:, None]
    mask = torch.ones_like(r) if mask is None else torch.tensor(mask)[:, None]
    return PolicyLossInputs(logps, old_logps, adv, mask)


def loss_and_grad(name, inputs, cfg):
    out = get_policy_loss(name)(inputs, cfg)
    (grad,) = torch.autograd.grad((out.per_token_loss * inputs.mask).sum(), inputs.logps)
    names, rows = flatten_metrics(out.metrics)
    metrics = {name: (float(n), float(d)) for name, (n, d) in zip(names, rows)}
    return out.per_token_loss.detach().flatten().tolist(), grad.flatten().tolist(), metrics


def test_dapo_clip_higher_by_hand():
    inputs = tokens([1.25, 1.4, 0.75, 0.7, 5.0], [1.0, 1.0, -1.0, -1.0, -1.0])
    loss, grad, metrics = loss_and_grad("dapo", inputs, config())
    # [0.8, 1.3]: 1.25 inside -> -1.25 (grad -r); 1.4 clipped -> -1.3 (grad 0); 0.75 clipped low for A<0 -> 0.8;
    # 0.7 -> 0.8 clipped; r = 5 with A = -1 -> max(5, 1.3) = 5, dual-clipped to 3.
    assert loss == pytest.approx([-1.25, -1.3, 0.8, 0.8, 3.0])
    assert grad == pytest.approx([-1.25, 0.0, 0.0, 0.0, 0.0])
    assert metrics["clip_ratio/high_mean"] == (1.0, 5.0) and metrics["clip_ratio/low_mean"] == (2.0, 5.0)


def test_dapo_takes_the_papers_clip_higher_when_epsilon_high_is_unset():
    # r = 1.29 is inside [0.8, 1.3] but above the DAPO paper's 1.28: clipped with epsilon_high unset.
    inputs = tokens([1.29], [1.0])
    assert loss_and_grad("dapo", inputs, config())[0] == pytest.approx([-1.29])
    assert loss_and_grad("dapo", inputs, config(epsilon_high=None))[0] == pytest.approx([-1.28])
    assert loss_and_grad("ppo_clip", inputs, config(epsilon_high=None))[0] == pytest.approx([-1.2])  # TRL: = epsilon


@pytest.mark.parametrize("name", ["masked_cispo", "trl_cispo"])
def test_cispo_by_hand(name):
    inputs = tokens([1.5, 1.2, 0.5, 2.0, 0.9], [1.0, 1.0, -1.0, -1.0, 2.0], p_current=0.25)
    masked = name == "masked_cispo"
    # masked_cispo caps at cispo_clip_max (1.45), trl_cispo at epsilon_high (TRL's cap, here set to 1.45 too)
    loss, grad, metrics = loss_and_grad(name, inputs, config(epsilon_high=None if masked else 1.45))
    logp = math.log(0.25)
    # l = -A sg(clamp(r, 0, 1.45)) logp; grad wrt logp = -A clamp(r).
    weights = [1.45, 1.2, 0.5, 1.45, 0.9]
    adv = [1.0, 1.0, -1.0, -1.0, 2.0]
    expected_grad = [-a * w for a, w in zip(adv, weights)]
    if masked:  # (A > 0, r > 1.3) and (A < 0, r < 0.8) are dropped
        expected_grad[0] = expected_grad[2] = 0.0
    assert grad == pytest.approx(expected_grad)
    assert loss == pytest.approx([g * logp for g in expected_grad])
    assert metrics.get("cispo/mask_frac", (0.0, 5.0)) == ((2.0 if masked else 0.0), 5.0)
    assert metrics["cispo/weight_clip_frac"] == (2.0, 5.0)


def test_trl_cispo_caps_at_trls_five_when_epsilon_high_is_unset():
    inputs = tokens([6.0, 4.0], [1.0, 1.0])
    _, grad, _ = loss_and_grad("trl_cispo", inputs, config(epsilon_high=None))
    assert grad == pytest.approx([-5.0, -4.0])


def test_unclipped_is_the_importance_weighted_policy_gradient():
    # l = -A r whatever r: no clip (r = 3 with A > 0), no dual clip (r = 9 with A < 0), gradient -A r.
    inputs = tokens([3.0, 0.1, 9.0], [1.0, -1.0, -1.0])
    loss, grad, metrics = loss_and_grad("unclipped", inputs, config())
    assert loss == pytest.approx([-3.0, 0.1, 9.0])
    assert grad == pytest.approx([-3.0, 0.1, 9.0])
    assert metrics["clip_ratio/region_mean"] == (0.0, 3.0)


def test_sapo_soft_gate_by_hand():
    # l = -A (4 / tau) sigmoid(tau (r - 1)); dl/dlogp = -A r 4 s (1 - s), s = sigmoid(tau (r - 1)).
    inputs = tokens([1.0, 2.0, 0.5], [1.0, -1.0, -1.0])
    loss, grad, metrics = loss_and_grad("sapo", inputs, config())
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected_loss, expected_grad = [], []
    for r, a in ((1.0, 1.0), (2.0, -1.0), (0.5, -1.0)):
        tau = 1.0 if a > 0 else 1.05
        s = sig(tau * (r - 1))
        expected_loss.append(-a * 4 / tau * s)
        expected_grad.append(-a * r * 4 * s * (1 - s))
    assert loss == pytest.approx(expected_loss) and grad == pytest.approx(expected_grad)
    assert expected_loss[0] == pytest.approx(-2.0) and expected_grad[0] == pytest.approx(-1.0)  # r = 1: the PG
    # The gate is 1 at r = 1 and 4 s (1 - s) elsewhere; none of these three falls below one half.
    assert metrics["sapo/half_gated_frac"] == (0.0, 3.0)


def test_vespo_sequence_weight_by_hand():
    # One sequence of two tokens with log r = 0.1 and 0.2: w = e^0.3; A > 0: k = 2, lambda = 3, phi = e^3 w^2 e^(-3 w).
    logps = torch.log(torch.tensor([[0.5, 0.4]])).requires_grad_(True)
    old = logps.detach() - torch.tensor([[0.1, 0.2]])
    inputs = PolicyLossInputs(logps, old, torch.tensor([[1.5]]), torch.ones(1, 2))
    _, grad, metrics = loss_and_grad("vespo", inputs, config())
    w = math.exp(0.3)
    phi = math.exp(3 + 2 * math.log(w) - 3 * w)
    assert grad == pytest.approx([-1.5 * phi, -1.5 * phi])  # REINFORCE weighted by the detached phi
    assert metrics["vespo/phi_mean"][0] / metrics["vespo/phi_mean"][1] == pytest.approx(phi)


def test_per_sequence_entropy_selection_by_hand():
    entropies = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.4, 0.7, 0.6, 0.05],
                              [0.3, 0.2, 0.9, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0],
                              [0.1, 0.7, 0.2, 0.6, 0.3, 0.5, 0.4, 5.0, 5.0, 5.0],
                              [0.4, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0] * 10, [1.0] * 3 + [0.0] * 7, [1.0] * 7 + [0.0] * 3, [1.0] + [0.0] * 9])
    high = entropy_rank_mask(entropies, mask, 0.2)
    low = entropy_rank_mask(entropies, mask, 0.8, highest=False)
    # Row 0, n = 10: high k = int(0.2 * 10) = 2 -> 0.9 and 0.8 (positions 1, 4); low k = int(0.8 * 10) = 8, the rest.
    assert high[0].nonzero().flatten().tolist() == [1, 4]
    assert low[0].nonzero().flatten().tolist() == [0, 2, 3, 5, 6, 7, 8, 9]
    # Row 1, n = 3: high k = max(1, int(0.6)) = 1 -> position 2 (0.9); low k = int(2.4) = 2 -> positions 0, 1;
    # padded 5.0 entries never count.
    assert high[1].nonzero().flatten().tolist() == [2]
    assert low[1].nonzero().flatten().tolist() == [0, 1]
    # Row 2, n = 7: high k = max(1, int(1.4)) = 1 -> position 1 (0.7); low k = int(5.6) = 5 -> 0.1, 0.2, 0.3, 0.4,
    # 0.5 (positions 0, 2, 4, 6, 5): 0.6 (position 3) is in neither group, as the authors count them.
    assert high[2].nonzero().flatten().tolist() == [1]
    assert low[2].nonzero().flatten().tolist() == [0, 2, 4, 5, 6]
    # Row 3, n = 1: both keep the only token.
    assert high[3].nonzero().flatten().tolist() == [0] and low[3].nonzero().flatten().tolist() == [0]

    logps = torch.full((4, 10), math.log(0.5), requires_grad=True)
    adv = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    inputs = PolicyLossInputs(logps, logps.detach(), adv, mask, entropies=entropies)
    for name, keep in (("high_entropy", high), ("low_entropy", low)):
        out = get_policy_loss(name)(inputs, config())
        (grad,) = torch.autograd.grad((out.per_token_loss * mask).sum(), logps)
        # On-policy r = 1: kept tokens get -A, others 0.
        expected = torch.where(keep, -adv.expand(4, 10), torch.zeros(4, 10))
        torch.testing.assert_close(grad, expected)
        frac = float(out.metrics["entropy/selected_frac"][0]) / float(out.metrics["entropy/selected_frac"][1])
        assert frac == pytest.approx(keep.sum().item() / mask.sum().item())


def test_entropy_methods_clip_at_the_authors_range():
    # The authors' launcher runs the entropy baselines with clip 0.2 / 0.3 (config()): r = 1.25 (A > 0) is inside,
    # r = 1.35 is clipped at 1.3; one token per row, so each is its sequence's only (kept) token.
    inputs = tokens([1.25, 1.35], [1.0, 1.0])
    inputs.entropies = torch.ones(2, 1)
    for name in ("high_entropy", "low_entropy"):
        loss, grad, _ = loss_and_grad(name, inputs, config())
        assert loss == pytest.approx([-1.25, -1.3])
        assert grad == pytest.approx([-1.25, 0.0])


@pytest.mark.parametrize(
    "name,weight",
    [("dlogp_reweight", 1 + 0.2 * (1 - 0.25)), ("dominate", 0.2 * 0.25 + 1 - 0.2)],
)
def test_token_reweightings_by_hand(name, weight):
    # p_old = 0.25 for every token; r = 1.1 inside DAPO's clip, so the loss is -w A r and its gradient -w A r.
    p_old, r = 0.25, 1.1
    logps = torch.full((2, 1), math.log(p_old * r), requires_grad=True)
    inputs = PolicyLossInputs(logps, torch.full((2, 1), math.log(p_old)), torch.tensor([[2.0], [-1.0]]),
                              torch.ones(2, 1))
    loss, grad, metrics = loss_and_grad(name, inputs, config())
    assert loss == pytest.approx([-weight * 2.0 * r, weight * 1.0 * r])
    assert grad == pytest.approx([-weight * 2.0 * r, weight * 1.0 * r])
    assert metrics["reweight/mean_weight"][0] / metrics["reweight/mean_weight"][1] == pytest.approx(weight)


def test_reweighting_composes_with_the_chosen_objective():
    # r = 1.4 with A > 0 is clipped at the base objective's bound, epsilon_high unset: 1.28 for dapo, 1.2 for ppo_clip.
    logps = torch.full((1, 1), math.log(0.5 * 1.4), requires_grad=True)
    inputs = PolicyLossInputs(logps, torch.full((1, 1), math.log(0.5)), torch.ones(1, 1), torch.ones(1, 1))
    w = 1 + 0.2 * 0.5
    for base, bound in (("dapo", 1.28), ("ppo_clip", 1.2)):
        loss, _, _ = loss_and_grad("dlogp_reweight", inputs, config(reweight_base_loss=base, epsilon_high=None))
        assert loss == pytest.approx([-w * bound])


def test_ppl_reweighting_by_hand():
    logps = torch.full((3, 2), math.log(0.5), requires_grad=True)
    adv = torch.tensor([[1.0], [1.0], [-1.0]])
    z = torch.tensor([1.0, -1.0, 2.0])
    inputs = PolicyLossInputs(logps, logps.detach(), adv, torch.ones(3, 2), logppl_z=z)
    loss, _, _ = loss_and_grad("ppl", inputs, config())
    # w = 1 - 0.2 z = [0.8, 1.2, 0.6]; r = 1, so l = -w A.
    assert loss == pytest.approx([-0.8, -0.8, -1.2, -1.2, 0.6, 0.6])
    loss, _, _ = loss_and_grad("ppl", inputs, config(ppl_clamp=True))
    assert loss == pytest.approx([-0.8, -0.8, -1.2, -1.2, 0.8, 0.8])  # 0.6 clamped to 0.8
    with pytest.raises(ValueError, match="logppl_z"):
        get_policy_loss("ppl")(PolicyLossInputs(logps, logps.detach(), adv, torch.ones(3, 2)), config())


def test_ar_lopti_passes_by_hand():
    # Two tokens per row, p_old = 0.3 (low) and 0.8 (high); r = 1.3 for both (clipped at 1.24 for A > 0: the
    # method's epsilon_high when it is unset).
    p_old = torch.tensor([[0.3, 0.8]])
    logps = (p_old * 1.3).log().requires_grad_(True)
    inputs = PolicyLossInputs(logps, p_old.log(), torch.ones(1, 1), torch.ones(1, 2))
    w = [0.3 * 0.3 + 0.7, 0.3 * 0.8 + 0.7]
    for update_pass, kept in ((0, 0), (1, 1)):
        inputs.update_pass = update_pass
        loss, grad, metrics = loss_and_grad("ar_lopti", inputs, config(epsilon_high=None))
        expected = [0.0, 0.0]
        expected[kept] = -w[kept] * 1.24
        assert loss == pytest.approx(expected)
        assert grad == pytest.approx([0.0, 0.0])  # clipped: no gradient
        assert metrics["lopti/low_prob_frac"] == (1.0, 2.0)
    inputs.logps = (p_old * 1.1).log().requires_grad_(True)
    inputs.update_pass = 1
    _, grad, _ = loss_and_grad("ar_lopti", inputs, config(epsilon_high=None))
    assert grad == pytest.approx([0.0, -w[1] * 1.1])  # inside the clip: -w A r on the high-probability token


def test_p_old_falls_back_to_current_probability_on_policy():
    # The trainer passes old_logps = logps.detach() when TRL skips old log-probs: weights then use p_theta.
    logps = torch.full((1, 1), math.log(0.4), requires_grad=True)
    inputs = PolicyLossInputs(logps, logps.detach(), torch.ones(1, 1), torch.ones(1, 1))
    loss, _, _ = loss_and_grad("dlogp_reweight", inputs, config())
    assert loss == pytest.approx([-(1 + 0.2 * 0.6)])


# ---------------------------------------------------------------- trainer level


def diversity_reward(prompts, completions, **kwargs):
    """A dense reward for smoke runs: fraction of distinct characters in the completion."""
    return [len(set(c)) / max(len(c), 1) for c in completions]


def make_trainer(tmp_path, model_path, **overrides):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset

    args = ACPOConfig(**trainer_kwargs(tmp_path, **overrides))
    return ACPOTrainer(model_path, diversity_reward, args=args, train_dataset=toy_dataset(32),
                       processing_class=build_tokenizer())


def test_deprecated_unmasked_cispo_is_trls(tmp_path, tiny_dir):
    """The deprecated `cispo_mask: false` is trl_cispo with epsilon_high = cispo_clip_max: TRL's loss_type='cispo'
    (dapo normalisation) on the same inputs."""
    from trl import GRPOConfig, GRPOTrainer

    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset
    from test_trl_equivalence import loss_and_grads, make_inputs

    common = trainer_kwargs(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4, max_completion_length=7)
    trl_trainer = GRPOTrainer(tiny_dir, diversity_reward, args=GRPOConfig(**common, loss_type="cispo", epsilon_high=1.45),
                              train_dataset=toy_dataset(16), processing_class=build_tokenizer())
    ours = make_trainer(tmp_path, tiny_dir, gradient_accumulation_steps=2, steps_per_generation=4,
                        max_completion_length=7, policy_loss="cispo", cispo_mask=False, loss_type="dapo")
    for t in (trl_trainer, ours):
        t.current_gradient_accumulation_steps = 2
    inputs = make_inputs(trl_trainer.model)
    trl_loss, trl_grads = loss_and_grads(trl_trainer, inputs)
    our_loss, our_grads = loss_and_grads(ours, inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-6, atol=1e-7)
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_ppl_group_zscore_at_rollout(tmp_path, tiny_dir):
    trainer = make_trainer(tmp_path, tiny_dir, policy_loss="ppl", steps_per_generation=2)
    old = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.5], [0.5, 0.9], [0.1, 0.1],
                                  [0.2, 0.2], [0.2, 0.2], [0.4, 0.3], [0.6, 0.6]]))
    batch = {"completion_mask": torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 1]]),
             "old_per_token_logps": old}
    z = trainer._group_logppl_z(batch)
    logppl = [-(old[i] * batch["completion_mask"][i]).sum() / batch["completion_mask"][i].sum() for i in range(8)]
    for g in range(2):  # num_generations = 4: rows 0-3 and 4-7
        values = torch.stack(logppl[4 * g : 4 * g + 4])
        expected = (values - values.mean()) / (values.std(unbiased=False) + 1e-6)
        torch.testing.assert_close(z[4 * g : 4 * g + 4], expected)


def test_ar_lopti_second_pass_sees_first_pass_movement(tmp_path, tiny_dir):
    trainer = make_trainer(tmp_path, tiny_dir, policy_loss="ar_lopti", max_steps=4, learning_rate=5e-2)
    assert trainer.args.num_iterations == 2 and trainer.args.updates_per_rollout == 2
    seen = []
    loss_fn = trainer.policy_loss_fn

    def recording(inputs, cfg):
        moved = ((inputs.logps.detach() - inputs.old_logps) * inputs.mask).abs().max().item()
        seen.append((inputs.update_pass, moved))
        return loss_fn(inputs, cfg)

    trainer.policy_loss_fn = recording
    trainer.train()
    assert [p for p, _ in seen] == [0, 1, 0, 1]
    assert seen[0][1] < 1e-6 and seen[2][1] < 1e-6  # first pass of a rollout: old == current
    assert seen[1][1] > 1e-4 and seen[3][1] > 1e-4  # second pass: the first pass moved the policy


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_off_policy_training_run(tmp_path, tiny_dir, method):
    own_metric = {
        "dapo": "clip_ratio/region_mean", "masked_cispo": "cispo/mask_frac", "trl_cispo": "cispo/weight_clip_frac",
        "high_entropy": "entropy/selected_frac", "low_entropy": "entropy/selected_frac",
        "ar_lopti": "lopti/low_prob_frac", "dlogp_reweight": "reweight/mean_weight", "dominate": "reweight/mean_weight",
        "ppl": "reweight/mean_weight", "sapo": "sapo/gate_mean", "vespo": "vespo/phi_mean",
        "unclipped": "clip_ratio/region_mean",
    }[method]
    trainer = make_trainer(tmp_path, tiny_dir, policy_loss=method, steps_per_generation=2, max_steps=4,
                           learning_rate=2e-2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "policy_loss" in entry]
    assert logs and all(math.isfinite(entry["policy_loss"]) for entry in logs)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    assert all(own_metric in entry and entry[own_metric] is not None for entry in logs)
