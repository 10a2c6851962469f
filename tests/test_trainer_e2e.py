"""End to end: a few off-policy ACPOTrainer steps on the tiny local model; config validation and warnings."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from conftest import trainer_kwargs


def test_config_defaults_are_the_papers_run(tmp_path):
    from acpo_trl import ACPOConfig

    args = ACPOConfig(**trainer_kwargs(tmp_path))
    assert (args.policy_loss, args.acpo_num_bins, args.acpo_alpha, args.epsilon) == ("acpo", 5, 3.0, 0.2)
    assert (args.acpo_clip_min, args.acpo_clip_max, args.dual_clip_c) == (0.0, 3.0, 3.0)
    assert (args.loss_type, args.acpo_stats_scope) == ("grpo", "local")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"policy_loss": "ppo"}, "ACPOConfig.policy_loss='ppo'"),
        ({"acpo_num_bins": 0}, "ACPOConfig.acpo_num_bins=0"),
        ({"acpo_alpha": -1.0}, "ACPOConfig.acpo_alpha=-1.0"),
        ({"acpo_clip_max": -0.1}, "ACPOConfig.acpo_clip_max=-0.1"),
        ({"dual_clip_c": 0.5}, "ACPOConfig.dual_clip_c=0.5"),
        ({"acpo_stats_scope": "world"}, "ACPOConfig.acpo_stats_scope='world'"),
        ({"loss_type": "cispo"}, "ACPOConfig.loss_type='cispo': 'cispo' is TRL's own objective"),
        ({"loss_type": "sapo", "policy_loss": "dapo"}, "set policy_loss='sapo' with loss_type='grpo'"),
        ({"importance_sampling_level": "sequence"}, "ACPOConfig.importance_sampling_level='sequence': "
                                                    "policy_loss='acpo' does not read it (it is token-level"),
        ({"policy_loss": "cispo", "delta": 2.0}, "ACPOConfig.delta=2.0: policy_loss='masked_cispo' does not read it"),
        ({"policy_loss": "sapo", "dual_clip_c": None}, "ACPOConfig.dual_clip_c=None: policy_loss='sapo' does not read"),
        ({"policy_loss": "trl", "diagnostics": True}, "ACPOConfig.diagnostics=True"),
        ({"policy_loss": "dapo", "dapo_clip_high": -0.3}, "ACPOConfig.dapo_clip_high=-0.3"),
        ({"policy_loss": "acpo", "epsilon_high": 0.28}, "ACPOConfig.epsilon_high=0.28: ACPO's range per bin"),
        ({"policy_loss": "dapo", "dapo_clip_high": 0.3, "epsilon_high": 0.28}, "deprecated, and epsilon_high=0.28"),
        ({"policy_loss": "ar_lopti", "num_iterations": 3}, "ACPOConfig.num_iterations=3: ar_lopti makes exactly 2"),
    ],
)
def test_invalid_values_fail_at_construction_naming_the_field(tmp_path, overrides, message):
    from acpo_trl import ACPOConfig

    with pytest.raises(ValueError) as info:
        ACPOConfig(**trainer_kwargs(tmp_path, **overrides))
    assert message in str(info.value)


def test_trl_options_that_compose_are_accepted(tmp_path):
    """TRL's options that have a meaning with a registry method are accepted (superset of GRPOConfig)."""
    from acpo_trl import ACPOConfig

    for overrides in ({"top_entropy_quantile": 0.2}, {"entropy_coef": 0.01}, {"use_adaptive_entropy": True},
                      {"off_policy_mask_threshold": 0.5}, {"delta": 2.0}, {"loss_type": "luspo"},
                      {"policy_loss": "trl", "loss_type": "sapo", "importance_sampling_level": "sequence"}):
        args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=4, **overrides))
        assert all(getattr(args, k) == v for k, v in overrides.items())


def test_on_policy_configuration_warns(tmp_path, caplog):
    from acpo_trl import ACPOConfig

    with caplog.at_level(logging.WARNING, logger="acpo_trl.config"):
        on = ACPOConfig(**trainer_kwargs(tmp_path))
    assert on.is_on_policy and "ACPO equals a fixed clip" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="acpo_trl.config"):
        off = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=4))
    assert not off.is_on_policy and off.updates_per_rollout == 4 and caplog.text == ""


def test_trainer_rejects_a_plain_grpo_config(tmp_path, tiny_model):
    from trl import GRPOConfig

    from acpo_trl import ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = tiny_model
    with pytest.raises(TypeError, match="ACPOConfig"):
        ACPOTrainer(model, toy_reward, args=GRPOConfig(**trainer_kwargs(tmp_path)), train_dataset=toy_dataset(8),
                    processing_class=tokenizer)


@pytest.mark.slow
def test_off_policy_acpo_training_run(tmp_path, tiny_model):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = tiny_model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=4, max_steps=8, learning_rate=2e-2))
    trainer = ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(32), processing_class=tokenizer)
    trainer.train()

    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert moved, "no parameter changed"
    logs = [entry for entry in trainer.state.log_history if "policy_loss" in entry]
    assert len(logs) == 8
    assert all(math.isfinite(entry["policy_loss"]) for entry in logs)
    for b in range(5):
        assert all(f"acpo/bin{b}/{name}" in logs[0] for name in ("eps", "std", "token_frac", "clip_frac_pos",
                                                                  "clip_frac_neg"))
    # First update of each rollout (steps 1, 5): ratio == 1, every bin sits at the base. Later updates: the
    # policy has moved and some bin's range has widened.
    eps = [[entry[f"acpo/bin{b}/eps"] for b in range(5) if entry.get(f"acpo/bin{b}/token_frac")] for entry in logs]
    assert all(e == pytest.approx(0.2, abs=1e-3) for e in eps[0])
    assert any(e > 0.21 for step in eps[1:4] + eps[5:] for e in step)


@pytest.mark.slow
def test_a_void_lower_clip_is_said_once_per_run(tmp_path, tiny_model, caplog):
    """When ACPO's eps passes 1 in a bin (1 - eps < 0: the lower clip bounds nothing), one log line names the
    bins and the update of the rollout and points to the drift map; a clamp below 1 never says it."""
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = tiny_model
    for clip_max, expected in ((3.0, 1), (0.9, 0)):
        args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=4, max_steps=8, learning_rate=2e-2,
                                           acpo_alpha=200.0, acpo_clip_max=clip_max))
        trainer = ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(32), processing_class=tokenizer)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="acpo_trl.trainer"):
            trainer.train()
        said = [r.getMessage() for r in caplog.records if "lower clip is void" in r.getMessage()]
        assert len(said) == expected, said
        if said:
            logs = [e for e in trainer.state.log_history if "policy_loss" in e]
            def void(entry):  # an empty bin logs None
                return [b for b in range(5) if (entry.get(f"acpo/bin{b}/eps") or 0) > 1]

            first = next(i for i, e in enumerate(logs) if void(e))
            bins = void(logs[first])
            assert f"bin(s) {', '.join(map(str, bins))} " in said[0]
            assert f"at update {first % 4 + 1} of 4 of a rollout (optimizer step {first + 1})" in said[0]
            assert "docs/RESULTS.md" in said[0] and first % 4 > 0  # never at k = 0, where r = 1
            assert "\n" not in said[0] and len(said[0]) < 250  # one console line; report.md explains


def test_freed_host_memory_is_returned_between_phases(tmp_path, tiny_model, monkeypatch):
    """release_freed_memory returns what freed tensors left in glibc's heap (the resident size falls), and
    ACPOTrainer on CPU calls it after each rollout, forward pass and micro-step."""
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.training.host_memory import release_freed_memory
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    def resident_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    blocks = [torch.ones(64, 1024) for _ in range(2000)]  # 256 KB each: below glibc's mmap threshold, in the heap
    del blocks[: len(blocks) - 1]  # freed, but the last block pins the top of the heap
    before = resident_mb()
    assert release_freed_memory() and resident_mb() < before - 200

    calls = []
    monkeypatch.setattr("acpo_trl.trainer.release_freed_memory", lambda: calls.append(1))
    model, tokenizer = tiny_model
    args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=2, max_steps=2))
    ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(16), processing_class=tokenizer).train()
    assert len(calls) == 1 + 2 * 2  # one rollout; a forward and a micro-step per update
