"""The drift guard (acpo_trl/training/drift_guard.py): its measures, and ACPOTrainer stopping a rollout's reuse past the
threshold without moving the optimizer, for registry methods and TRL's own loss, with gradient accumulation and
num_iterations > 1, and resuming mid-rollout exactly. The 2-process runs (DDP, ZeRO-3, two "nodes") are in
tests/test_distributed_training.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from conftest import trainer_kwargs


def test_measures_equal_their_definitions_and_add_over_splits():
    """ratio_std is the population std of r over bin-0 tokens (current p < 1/K), kl the mean of r - 1 - log r over
    valid tokens; the sums of two halves of a batch give the measures of the whole (as over processes)."""
    from acpo_trl.training.drift_guard import drift_measure, drift_sums

    torch.manual_seed(0)
    logps = torch.rand(6, 9).clamp(min=1e-3).log()
    old = logps + 0.4 * torch.randn(6, 9)
    mask = (torch.rand(6, 9) > 0.3).float()
    ratio = (logps.double() - old.double()).exp()
    low = (logps.exp() < 0.2) & mask.bool()
    assert low.any()
    r0 = ratio[low]
    expected_std = ((r0 - r0.mean()) ** 2).mean().sqrt().item()
    valid = mask.bool()
    expected_kl = (ratio[valid] - 1 - (logps.double() - old.double())[valid]).mean().item()
    sums = drift_sums(logps, old, mask, num_bins=5)
    assert drift_measure(sums, "ratio_std") == pytest.approx(expected_std, rel=1e-9)
    assert drift_measure(sums, "kl") == pytest.approx(expected_kl, rel=1e-9)
    halves = drift_sums(logps[:3], old[:3], mask[:3], 5) + drift_sums(logps[3:], old[3:], mask[3:], 5)
    assert torch.allclose(halves, sums, rtol=1e-12)
    # On-policy the ratio is 1: both measures are 0. No token to measure: NaN, which passes no threshold.
    assert drift_measure(drift_sums(logps, logps, mask, 5), "ratio_std") == 0.0
    assert drift_measure(drift_sums(logps, logps, mask, 5), "kl") == 0.0
    assert math.isnan(drift_measure(drift_sums(logps, old, torch.zeros_like(mask), 5), "kl"))


def _guard(**fields):
    from types import SimpleNamespace

    from acpo_trl.training.drift_guard import DriftGuard

    args = dict(drift_guard="ratio_std", drift_guard_threshold=0.3, drift_guard_min_tokens=16,
                drift_guard_fallback_threshold=None, acpo_num_bins=5, steps_per_generation=4, num_iterations=1,
                gradient_accumulation_steps=1)
    return DriftGuard(SimpleNamespace(**{**args, **fields}), all_reduce=lambda t: t)


def _batch(rare: int, common: int, rare_ratio: float = 1.0, common_ratio: float = 1.0):
    """One row of ``rare`` bin-0 tokens (current p = 0.1) at ratio ``rare_ratio`` alternating with its inverse, and
    ``common`` tokens (p = 0.9) at ``common_ratio``: the current log-probs and the micro-batch's inputs."""
    import math

    rare_ratios = [rare_ratio if i % 2 == 0 else 1 / rare_ratio for i in range(rare)]
    logps = torch.tensor([[math.log(0.1)] * rare + [math.log(0.9)] * common])
    ratios = torch.tensor([rare_ratios + [common_ratio] * common])
    inputs = {"completion_mask": torch.ones_like(logps), "old_per_token_logps": logps - ratios.log()}
    return logps, inputs


def _decide(guard, step, logps, inputs):
    skipped = guard.skips(step)
    guard.expect(inputs)
    return skipped, guard.decide(logps)


def test_the_token_rule_decides_on_enough_tokens_and_says_on_how_many():
    """ratio_std decides on >= min_tokens bin-0 tokens; with an empty bin 0 or a single token it falls back to k3
    over all tokens (0.07); with too few tokens for either the update is applied. Each decision logs its tokens and
    how it was taken, and is counted."""
    from acpo_trl.training.drift_guard import FALLBACK, OWN, UNDECIDED

    guard = _guard()
    # 16 bin-0 tokens at r = 2 and 1/2: std 0.75 > 0.3, decided on ratio_std: cut
    assert _decide(guard, 0, *_batch(16, 8, rare_ratio=2.0)) == (False, True)
    assert (guard.state.decided_by, guard.state.bin0_tokens, guard.state.tokens) == (OWN, 16, 24)
    assert guard.state.ratio_std == pytest.approx(0.75) and guard.state.rollout_cut
    assert guard.skips(1) and guard.rollouts_cut == 1  # the rest of the rollout is skipped
    # a new rollout; an empty bin 0: k3 over 20 tokens decides (tiny drift: applied)
    assert _decide(guard, 4, *_batch(0, 20, common_ratio=1.01)) == (False, False)
    assert guard.state.decided_by == FALLBACK and guard.state.bin0_tokens == 0 and guard.state.kl < 0.07
    # a single bin-0 token, far off (its std is 0, not a drift): the fallback on k3 of all 20 tokens cuts
    assert _decide(guard, 5, *_batch(1, 19, rare_ratio=40.0, common_ratio=2.0)) == (False, True)
    assert (guard.state.decided_by, guard.state.ratio_std, guard.state.bin0_tokens) == (FALLBACK, 0.0, 1)
    assert guard.state.kl > 0.07
    # too few tokens for either measure: applied, undecided
    assert _decide(guard, 8, *_batch(2, 3, rare_ratio=3.0)) == (False, False)
    assert guard.state.decided_by == UNDECIDED and guard.state.ratio_std > 0.3
    assert guard.state.decisions == (1, 2, 1)
    assert (guard.updates_applied, guard.rollouts_cut) == (2, 2)
    logged = guard.metrics()
    assert (logged["drift_guard/bin0_tokens"], logged["drift_guard/tokens"], logged["drift_guard/decided_by"]) == (
        2, 5, UNDECIDED)


def test_the_kl_guard_and_a_fallback_threshold():
    from acpo_trl.training.drift_guard import OWN, UNDECIDED

    guard = _guard(drift_guard="kl", drift_guard_threshold=0.05)
    assert _decide(guard, 0, *_batch(0, 16, common_ratio=2.0)) == (False, True)  # k3 = 1 - log 2 = 0.31
    assert guard.state.decided_by == OWN and guard.state.kl == pytest.approx(1 - math.log(2))
    assert _decide(guard, 4, *_batch(0, 15, common_ratio=2.0)) == (False, False)  # 15 < 16 tokens
    assert guard.state.decided_by == UNDECIDED
    lenient = _guard(drift_guard_fallback_threshold=0.5)
    assert _decide(lenient, 0, *_batch(0, 16, common_ratio=2.0)) == (False, False)  # 0.31 < 0.5
    from types import SimpleNamespace

    from acpo_trl.training.report import guard_rule

    rule = dict(drift_guard="ratio_std", drift_guard_threshold=0.3, drift_guard_min_tokens=16)
    assert guard_rule(SimpleNamespace(**rule, drift_guard_fallback_threshold=0.5)) == (
        "ratio_std > 0.3 on >= 16 bin-0 tokens, else kl > 0.5")
    assert guard_rule(SimpleNamespace(**rule, drift_guard_fallback_threshold=None)).endswith("else kl > 0.07")
    # only an update's first micro-batch is measured, once
    guard = _guard(gradient_accumulation_steps=2)
    assert _decide(guard, 0, *_batch(0, 16)) == (False, False) and guard.state.decisions == (0, 1, 0)
    assert _decide(guard, 1, *_batch(0, 16, common_ratio=5.0)) == (False, False) and guard.state.decisions == (0, 1, 0)


def test_a_checkpointed_state_round_trips_and_an_older_one_loads():
    guard = _guard()
    _decide(guard, 0, *_batch(16, 0, rare_ratio=2.0))
    restored = _guard()
    restored.load_dict(guard.to_dict())
    assert restored.to_dict() == guard.to_dict()
    older = {"rollout_cut": True, "updates_in_rollout": 3, "rollouts_cut": 1, "updates_applied": 7,
             "ratio_std": 0.1, "kl": 0.01}  # saved before the token rule
    restored.load_dict(older)
    assert restored.updates_applied == 7 and restored.state.decisions == (0, 0, 0)


@pytest.mark.parametrize("overrides,message", [
    ({"drift_guard": "kl"}, "ACPOConfig.drift_guard_threshold=None: drift_guard='kl' needs a threshold > 0"),
    ({"drift_guard": "ratio_std", "drift_guard_threshold": 0.0}, "ACPOConfig.drift_guard_threshold=0.0"),
    ({"drift_guard": "approx_kl", "drift_guard_threshold": 0.1}, "ACPOConfig.drift_guard='approx_kl': must be one"),
    ({"drift_guard_threshold": 0.3}, "ACPOConfig.drift_guard_threshold=0.3: has no effect without drift_guard"),
    ({"drift_guard_fallback_threshold": 0.1}, "ACPOConfig.drift_guard_fallback_threshold=0.1: has no effect"),
    ({"drift_guard": "kl", "drift_guard_threshold": 0.1, "drift_guard_fallback_threshold": 0.1},
     "ACPOConfig.drift_guard_fallback_threshold=0.1: is the k3 threshold of drift_guard='ratio_std'"),
    ({"drift_guard": "ratio_std", "drift_guard_threshold": 0.3, "drift_guard_min_tokens": 0},
     "ACPOConfig.drift_guard_min_tokens=0: must be an integer >= 1"),
    ({"num_rollouts": 0}, "ACPOConfig.num_rollouts=0: must be an integer >= 1"),
    ({"num_rollouts": 2, "max_steps": 3}, "ACPOConfig.num_rollouts=2: 8 steps, but max_steps=3"),
    ({"num_rollouts": 2, "steps_per_generation": 3, "gradient_accumulation_steps": 2},
     "a rollout holds 1.5 optimizer updates"),
])
def test_guard_fields_fail_at_construction_naming_the_field(tmp_path, overrides, message):
    from acpo_trl import ACPOConfig

    kwargs = {"steps_per_generation": 4, **overrides}
    with pytest.raises(ValueError) as info:
        ACPOConfig(**trainer_kwargs(tmp_path, **kwargs))
    assert message in str(info.value)


def test_num_rollouts_sets_max_steps(tmp_path):
    from acpo_trl import ACPOConfig

    args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=8, gradient_accumulation_steps=2,
                                       num_iterations=2, num_rollouts=3))
    assert args.max_steps == 3 * 8  # 8 x 2 / 2 = 8 updates per rollout


def _train(tmp_path, tiny_model, name, rollouts=2, **overrides):
    """A guarded (or not) off-policy run of the tiny model; returns the trainer and the Adam step count of each
    parameter after every optimizer step (recorded by a callback)."""
    from transformers import TrainerCallback

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = copy.deepcopy(tiny_model[0]), tiny_model[1]  # every run starts from the same weights
    fields = dict(steps_per_generation=4, learning_rate=2e-2, num_rollouts=rollouts)
    fields.update(overrides)
    args = ACPOConfig(**trainer_kwargs(tmp_path / name, **fields))
    adam_steps, weights = [], []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, model=None, **kwargs):
            steps = {int(s["step"]) for s in optimizer.state.values() if "step" in s}
            adam_steps.append(steps)
            weights.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))

    trainer = ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(64), processing_class=tokenizer,
                          callbacks=[Record()])
    trainer.train()
    return trainer, adam_steps, weights


@pytest.mark.parametrize("policy_loss", ["acpo", "trl"])
def test_a_guard_that_always_acts_applies_only_each_rollouts_first_update(tmp_path, tiny_model, policy_loss):
    """A threshold below any drift: the first update of a rollout (r = 1, drift 0) is applied, the second passes the
    threshold, and it and the rollout's remaining ones are skipped: no forward, no backward, and the optimizer does
    not move (Adam's step count is the number of applied updates; the weights stay put). Run length in rollouts:
    the run still samples 2 rollouts in 8 steps."""
    trainer, adam_steps, weights = _train(tmp_path, tiny_model, "cut", policy_loss=policy_loss,
                                          drift_guard="ratio_std", drift_guard_threshold=1e-9)
    guard = trainer.drift_guard
    assert (trainer.state.global_step, guard.updates_applied, guard.rollouts_cut) == (8, 2, 2)
    assert adam_steps == [{1}, {1}, {1}, {1}, {2}, {2}, {2}, {2}]
    for step in (1, 2, 5, 6):  # no weight moves in a skipped step
        assert torch.equal(weights[step], weights[step + 1])
    assert not torch.equal(weights[3], weights[4])  # the next rollout's first update is applied
    logs = [e for e in trainer.state.log_history if "drift_guard/updates_in_rollout" in e]
    assert [e["drift_guard/updates_in_rollout"] for e in logs] == [1, 1, 1, 1] * 2
    assert [e["drift_guard/rollouts_cut"] for e in logs] == [0, 1, 1, 1, 1, 2, 2, 2]
    measured = [e["drift_guard/ratio_std"] for e in logs]
    assert measured[0] == 0.0 and measured[1] > 0 and measured[2] is None and measured[4] == 0.0
    assert logs[1]["drift_guard/kl"] > 0  # the other measure, logged to compare
    assert trainer._step == 8  # TRL's micro-step counter went on through the skipped ones
    trainer.create_model_card(model_name="tiny")
    card = (tmp_path / "cut" / "README.md").read_text()
    assert "| drift guard | ratio_std > 1e-09: cut 2 of 2 rollouts short, 2 of 8 updates applied |" in card
    assert "| drift guard, as measured | SmolLM2-135M" in card  # what the study measured, beside what this run did


def test_the_report_states_the_guard(tmp_path):
    from types import SimpleNamespace

    from acpo_trl import ACPOConfig
    from acpo_trl.training.report import write_report

    args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=4, drift_guard="ratio_std",
                                       drift_guard_threshold=0.3))
    script = SimpleNamespace(task="addition", num_eval_tasks=4, eval_k=2, eval_temperature=1.0,
                             eval_sampler="multinomial")
    entries = [{"step": s, "drift_guard/updates_applied": a, "drift_guard/rollouts_cut": c}
               for s, a, c in ((1, 1, 0), (4, 4, 0), (5, 5, 0), (8, 6, 1))]
    text = write_report(str(tmp_path / "report.md"), script, args, "m", {"eval/x/avg@2": 0.1}, {"eval/x/avg@2": 0.2},
                        60.0, entries)
    assert "Drift guard: ratio_std > 0.3: cut 1 of 2 rollouts short, 6 of 8 updates applied" in text


@pytest.mark.parametrize("measure", ["ratio_std", "kl"])
def test_a_guard_that_never_acts_changes_nothing(tmp_path, tiny_model, measure):
    """A threshold above any drift: the same weights as the unguarded run, bit for bit."""
    _, _, unguarded = _train(tmp_path, tiny_model, "plain", rollouts=1)
    trainer, _, guarded = _train(tmp_path, tiny_model, measure, rollouts=1, drift_guard=measure,
                                 drift_guard_threshold=1e6)
    assert all(torch.equal(a, b) for a, b in zip(guarded, unguarded))
    assert (trainer.drift_guard.updates_applied, trainer.drift_guard.rollouts_cut) == (4, 0)


@pytest.mark.parametrize("overrides,applied", [
    # 2 micro-batches per update, 2 updates per rollout: the second update is measured on its first micro-batch
    ({"gradient_accumulation_steps": 2}, [{1}, {1}, {2}, {2}]),
    # 2 passes over a rollout of 2 mini-batches: cut at the second update, the second pass skipped too
    ({"steps_per_generation": 2, "num_iterations": 2}, [{1}, {1}, {1}, {1}, {2}, {2}, {2}, {2}]),
])
def test_the_guard_with_accumulation_and_iterations(tmp_path, tiny_model, overrides, applied):
    trainer, adam_steps, weights = _train(tmp_path, tiny_model, "ga", drift_guard="kl",
                                          drift_guard_threshold=1e-12, **overrides)
    assert adam_steps == applied
    assert trainer.drift_guard.rollouts_cut == 2 and trainer.drift_guard.updates_applied == 2


@pytest.mark.parametrize("guard", [{}, {"drift_guard": "ratio_std", "drift_guard_threshold": 1e-9}])
def test_a_checkpoint_mid_rollout_resumes_exactly(tmp_path, tiny_model, guard):
    """A checkpoint at step 2 of a 4-update rollout (with the guard: after its cut) and a run resumed from it end
    with the uninterrupted run's weights, bit for bit: the checkpoint keeps TRL's micro-step counter, the rollout
    and the guard's state (TRL alone would sample a new rollout on resume)."""
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = tiny_model
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    fields = dict(steps_per_generation=4, learning_rate=2e-2, num_rollouts=2, save_strategy="steps", save_steps=2,
                  **guard)
    args = ACPOConfig(**trainer_kwargs(tmp_path / "full", **fields))
    full = ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(64), processing_class=tokenizer)
    full.train()
    final = {n: p.detach().clone() for n, p in full.model.named_parameters()}

    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(initial[n])
    resumed = ACPOTrainer(model, toy_reward, args=ACPOConfig(**trainer_kwargs(tmp_path / "full", **fields)),
                          train_dataset=toy_dataset(64), processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert all(torch.equal(p.detach(), final[n]) for n, p in resumed.model.named_parameters())
    if guard:
        assert (resumed.drift_guard.updates_applied, resumed.drift_guard.rollouts_cut) == (2, 2)
