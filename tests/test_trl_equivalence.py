"""ACPOTrainer with policy_loss='ppo_clip' computes TRL GRPOTrainer's loss and gradients on the same inputs, also
with TRL's options composed (entropy bonus, adaptive entropy, top-entropy and off-policy masks, luspo); with
policy_loss='trl' it is GRPOTrainer for TRL's own objectives (cispo, sapo, vespo, GSPO); ACPO with one bin equals a
fixed clip of the resulting eps."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import trainer_kwargs


def make_inputs(model, seed=0, batch=4, prompt_len=5, completion_len=7, off_policy=True, beta=0.0):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(4, vocab, (batch, prompt_len), generator=g)
    completion_ids = torch.randint(4, vocab, (batch, completion_len), generator=g)
    prompt_mask = torch.ones(batch, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    completion_mask = torch.ones(batch, completion_len, dtype=torch.long)
    completion_mask[1, 4:] = 0  # an early EOS
    completion_mask[2, 2:] = 0
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.3, -0.7, 0.4, -1.5]),
        "num_items_in_batch": completion_mask.sum().float() * 2,
    }
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
        logps = torch.log_softmax(logits[:, prompt_len - 1 : -1], -1).gather(-1, completion_ids[..., None])[..., 0]
    if off_policy:
        # Old log-probs far enough from the current ones that both clip sides are active.
        inputs["old_per_token_logps"] = logps + 0.6 * torch.randn(logps.shape, generator=g)
    if beta:
        inputs["ref_per_token_logps"] = logps + 0.2 * torch.randn(logps.shape, generator=g)
    return inputs


def loss_and_grads(trainer, inputs):
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs, loss_rtol=1e-6, grad_rtol=1e-5):
    trl_loss, trl_grads = loss_and_grads(trl_trainer, inputs)
    our_loss, our_grads = loss_and_grads(acpo_trainer, inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=loss_rtol, atol=1e-7)
    assert trl_grads.keys() == our_grads.keys() and trl_grads
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=grad_rtol, atol=1e-7, msg=name)


@pytest.fixture(scope="module")
def trainers(tmp_path_factory, tiny_dir):
    """Build the GRPOTrainer / ACPOTrainer pairs once per configuration (TRL trainers are slow to build)."""
    from trl import GRPOConfig, GRPOTrainer

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.losses import POLICY_LOSSES
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    cache = {}
    model_dir = tiny_dir  # TRL builds the reference model (beta > 0) from the model's path
    tokenizer = build_tokenizer()

    def get(loss_type, beta=0.0, grad_accum=2, steps_per_generation=4, epsilon=0.2, epsilon_high=0.28, delta=None,
            policy_loss="ppo_clip", aggregation=None, **options):
        """GRPOTrainer with ``loss_type`` and ACPOTrainer with ``policy_loss`` aggregated by ``aggregation`` (default
        ``loss_type``), both with ``options``; the dual clip off where the method has one (TRL has none)."""
        key = (loss_type, beta, grad_accum, steps_per_generation, epsilon, epsilon_high, delta, policy_loss, aggregation,
               tuple(sorted(options.items())))
        if key not in cache:
            common = trainer_kwargs(
                tmp_path_factory.mktemp("eq"),
                loss_type=loss_type,
                beta=beta,
                gradient_accumulation_steps=grad_accum,
                steps_per_generation=steps_per_generation,
                epsilon=epsilon,
                epsilon_high=epsilon_high,
                delta=delta,
                max_completion_length=7,
                **options,
            )
            data = toy_dataset(16)
            trl_trainer = GRPOTrainer(
                model_dir, toy_reward, args=GRPOConfig(**common), train_dataset=data, processing_class=tokenizer
            )
            ours = dict(common, policy_loss=policy_loss, loss_type=aggregation or loss_type)
            if policy_loss in POLICY_LOSSES and "dual_clip_c" in POLICY_LOSSES[policy_loss].reads:
                ours["dual_clip_c"] = None
            acpo_trainer = ACPOTrainer(model_dir, toy_reward, args=ACPOConfig(**ours), train_dataset=data,
                                       processing_class=tokenizer)
            for t in (trl_trainer, acpo_trainer):
                t.current_gradient_accumulation_steps = grad_accum
            cache[key] = (trl_trainer, acpo_trainer)
        return cache[key]

    return get


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("off_policy", [True, False])
def test_ppo_clip_equals_trl(trainers, loss_type, off_policy):
    trl_trainer, acpo_trainer = trainers(loss_type)
    inputs = make_inputs(trl_trainer.model, off_policy=off_policy)
    assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs)
    if off_policy:
        # The inputs do exercise the clip (otherwise the comparison would be vacuous).
        assert acpo_trainer._metrics["train"]["clip_ratio/region_mean"][-1] > 0
        assert trl_trainer._metrics["train"]["clip_ratio/region_mean"][-1] == pytest.approx(
            acpo_trainer._metrics["train"]["clip_ratio/region_mean"][-1]
        )


@pytest.mark.parametrize("beta,delta", [(0.1, None), (0.0, 1.5)])
def test_kl_and_delta_equal_trl(trainers, beta, delta):
    trl_trainer, acpo_trainer = trainers("grpo", beta=beta, delta=delta)
    inputs = make_inputs(trl_trainer.model, beta=beta)
    assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs)
    if beta:
        assert acpo_trainer._metrics["train"]["kl"][-1] == pytest.approx(trl_trainer._metrics["train"]["kl"][-1])


def test_vllm_importance_sampling_correction_is_applied(trainers):
    trl_trainer, acpo_trainer = trainers("grpo")
    inputs = make_inputs(trl_trainer.model)
    inputs["importance_sampling_ratio"] = torch.rand(inputs["completion_ids"].shape, generator=torch.Generator().manual_seed(3)) + 0.5
    for t in (trl_trainer, acpo_trainer):
        t.use_vllm = t.vllm_importance_sampling_correction = True
    try:
        assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs)
    finally:
        for t in (trl_trainer, acpo_trainer):
            t.use_vllm = False


def test_acpo_with_one_bin_equals_fixed_clip_of_its_eps(trainers):
    """All tokens in one bin share one std, so ACPO is a fixed symmetric clip of eps = base + alpha * std."""
    from acpo_trl.losses import PolicyLossInputs, acpo_clip_range, get_policy_loss

    _, acpo_trainer = trainers("grpo")
    args = copy.copy(acpo_trainer.args)
    args.acpo_num_bins, args.dual_clip_c = 1, None
    inputs = make_inputs(acpo_trainer.model)
    logps = inputs["old_per_token_logps"] + 0.3 * torch.randn(inputs["old_per_token_logps"].shape)
    logps.requires_grad_(True)
    mask = inputs["completion_mask"].float()
    adv = inputs["advantages"][:, None]
    _, stats = acpo_clip_range(logps, inputs["old_per_token_logps"], mask, num_bins=1)
    eps = float(stats.eps[0])
    assert eps > 0.25  # the policy has moved: the range differs from the base

    acpo_out = get_policy_loss("acpo")(PolicyLossInputs(logps, inputs["old_per_token_logps"], adv, mask), args)
    args.epsilon = args.epsilon_high = eps
    fixed_out = get_policy_loss("ppo_clip")(PolicyLossInputs(logps, inputs["old_per_token_logps"], adv, mask), args)
    torch.testing.assert_close(acpo_out.per_token_loss * mask, fixed_out.per_token_loss * mask)
    (g1,) = torch.autograd.grad((acpo_out.per_token_loss * mask).sum(), logps)
    (g2,) = torch.autograd.grad((fixed_out.per_token_loss * mask).sum(), logps)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("options", [
    {"entropy_coef": 0.1},
    {"top_entropy_quantile": 0.5},
    {"entropy_coef": 0.1, "top_entropy_quantile": 0.5},
    {"off_policy_mask_threshold": 0.05},
    {"loss_type": "luspo"},
], ids=lambda o: "+".join(o))
def test_trl_options_compose_with_a_registry_method_as_in_trl(trainers, options):
    """TRL's options applied around a registry method (here its GRPO clip) give TRL's loss and gradients."""
    options = dict(options)
    trl_trainer, acpo_trainer = trainers(options.pop("loss_type", "grpo"), **options)
    inputs = make_inputs(trl_trainer.model)
    assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs)
    if "off_policy_mask_threshold" in options:
        # The mask does drop sequences here (a negative advantage and a large KL to the sampling policy).
        masked_loss = loss_and_grads(acpo_trainer, inputs)[0]
        acpo_trainer.off_policy_mask_threshold = None
        try:
            assert not torch.allclose(loss_and_grads(acpo_trainer, inputs)[0], masked_loss)
        finally:
            acpo_trainer.off_policy_mask_threshold = options["off_policy_mask_threshold"]


def test_adaptive_entropy_controller_follows_trl(trainers):
    trl_trainer, acpo_trainer = trainers("grpo", use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=10.0,
                                         entropy_coef_delta=0.01)
    for seed in range(3):  # each call ends an optimizer step (sync_gradients): the coefficient moves as in TRL
        inputs = make_inputs(trl_trainer.model, seed=seed)
        assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs)
        assert acpo_trainer.entropy_coef == pytest.approx(trl_trainer.entropy_coef)
        assert acpo_trainer._last_world_entropy == pytest.approx(trl_trainer._last_world_entropy)
    assert acpo_trainer.entropy_coef == pytest.approx(0.05 + 3 * 0.01)  # the target is above the entropy


@pytest.mark.parametrize("loss_type,options", [
    ("cispo", {}), ("sapo", {}), ("vespo", {}), ("grpo", {"importance_sampling_level": "sequence"}),
], ids=["cispo", "sapo", "vespo", "gspo"])
def test_policy_loss_trl_is_grpo_trainers_own_objective(trainers, loss_type, options):
    trl_trainer, acpo_trainer = trainers(loss_type, policy_loss="trl", **options)
    assert_same_loss_and_grads(trl_trainer, acpo_trainer, make_inputs(trl_trainer.model))


# TRL's trust regions as registry methods (which the diagnostics can read): (TRL's loss_type and options, the
# registry method, its aggregation as TRL gives it). GSPO at TRL's paper-index range; CISPO at a cap that binds here.
TRL_MIRRORS = {
    "gspo": ("grpo", {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}, "ppo_clip", "grpo"),
    "gspo_beta": ("grpo", {"importance_sampling_level": "sequence", "beta": 0.1, "use_bias_correction_kl": True},
                  "ppo_clip", "grpo"),
    "sapo": ("sapo", {"epsilon_high": None}, "sapo", "grpo"),
    "sapo_sequence": ("sapo", {"epsilon_high": None, "importance_sampling_level": "sequence"}, "sapo", "grpo"),
    "cispo": ("cispo", {"epsilon_high": 1.45}, "trl_cispo", "dapo"),
    "vespo": ("vespo", {"epsilon_high": None}, "vespo", "dapo"),
}


@pytest.mark.parametrize("name", list(TRL_MIRRORS))
def test_trls_objectives_as_registry_methods_equal_grpo_trainers(trainers, name):
    """GSPO, SAPO, TRL's CISPO and VESPO computed by the registry (with the diagnostics' tensors) give GRPOTrainer's
    loss and gradients on the same inputs, to 1e-6, with each objective's aggregation as TRL gives it."""
    loss_type, options, policy_loss, aggregation = TRL_MIRRORS[name]
    trl_trainer, acpo_trainer = trainers(loss_type, policy_loss=policy_loss, aggregation=aggregation, **options)
    inputs = make_inputs(trl_trainer.model, beta=options.get("beta", 0.0))
    assert_same_loss_and_grads(trl_trainer, acpo_trainer, inputs)
    if name == "gspo":  # the sequence-level clip binds on these inputs: the comparison is not vacuous
        assert acpo_trainer._metrics["train"]["clip_ratio/region_mean"][-1] > 0
