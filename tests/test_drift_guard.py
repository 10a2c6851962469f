"""The drift guard (acpo_trl/drift_guard.py): its measures, and ACPOTrainer stopping a rollout's reuse past the
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
    from acpo_trl.drift_guard import drift_measure, drift_sums

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


def test_guard_state_counts_and_cuts():
    from acpo_trl.drift_guard import DriftGuardState

    def sums(std):  # two bin-0 tokens at r = 1 +- std: their std is std
        return torch.tensor([2.0, 0.0, 2 * std**2, 2.0, 0.0], dtype=torch.float64)

    state = DriftGuardState()
    assert not state.record(sums(0.1), "ratio_std", 0.3) and state.ratio_std == pytest.approx(0.1)
    assert not state.record(torch.zeros(5, dtype=torch.float64), "ratio_std", 0.3) and math.isnan(state.ratio_std)
    assert state.record(sums(0.31), "ratio_std", 0.3) and state.rollout_cut
    assert (state.updates_in_rollout, state.updates_applied, state.rollouts_cut) == (2, 2, 1)
    state.start_rollout()
    assert (state.rollout_cut, state.updates_in_rollout, state.updates_applied) == (False, 0, 2)


@pytest.mark.parametrize("overrides,message", [
    ({"drift_guard": "kl"}, "ACPOConfig.drift_guard_threshold=None: drift_guard='kl' needs a threshold > 0"),
    ({"drift_guard": "ratio_std", "drift_guard_threshold": 0.0}, "ACPOConfig.drift_guard_threshold=0.0"),
    ({"drift_guard": "approx_kl", "drift_guard_threshold": 0.1}, "ACPOConfig.drift_guard='approx_kl': must be one"),
    ({"drift_guard_threshold": 0.3}, "ACPOConfig.drift_guard_threshold=0.3: has no effect without drift_guard"),
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
    from acpo_trl.toy import toy_dataset, toy_reward

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


def test_the_report_states_the_guard(tmp_path):
    from types import SimpleNamespace

    from acpo_trl import ACPOConfig
    from acpo_trl.train import write_report

    args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=4, drift_guard="ratio_std",
                                       drift_guard_threshold=0.3))
    script = SimpleNamespace(task="addition", num_eval_tasks=4, eval_k=2, eval_temperature=1.0)
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
    from acpo_trl.toy import toy_dataset, toy_reward

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
