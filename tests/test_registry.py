"""A method is one registry entry: a throwaway method registered from this file alone (with a need and a
validation) trains through ACPOTrainer with no change to the package; the entries of the built-in methods."""

from __future__ import annotations

import pytest
import torch

from conftest import trainer_kwargs

THROWAWAY = "throwaway_ppl_scaled_pg"


@pytest.fixture
def throwaway_method():
    """Register a method from the test file: -A w r with w = 1 + 0.1 z (the group log-perplexity z-score, a need),
    valid only for epsilon <= 0.5 (its own validation); unregistered afterwards."""
    from acpo_trl.losses import POLICY_LOSSES, PolicyLossOutput, importance_ratio, register_policy_loss

    seen = []

    def validate(config):
        if config.epsilon > 0.5:
            raise ValueError(f"ACPOConfig.epsilon={config.epsilon!r}: {THROWAWAY} needs epsilon <= 0.5.")

    @register_policy_loss(THROWAWAY, needs={"logppl_z"}, validate=validate, reads={"epsilon"})
    def loss(inputs, config):
        seen.append(inputs)
        weights = (1 + 0.1 * inputs.logppl_z).unsqueeze(-1)
        mask = inputs.mask
        per_token = -inputs.advantages * weights * importance_ratio(inputs.logps, inputs.old_logps)
        return PolicyLossOutput(per_token, {"throwaway/mean_weight": ((weights.expand_as(mask) * mask).sum(), mask.sum())})

    yield seen
    POLICY_LOSSES.pop(THROWAWAY)


@pytest.mark.slow
def test_a_method_registered_from_a_test_file_trains_through_the_trainer(tmp_path, tiny_dir, throwaway_method):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    with pytest.raises(ValueError, match=f"ACPOConfig.epsilon=0.9: {THROWAWAY} needs epsilon <= 0.5"):
        ACPOConfig(**trainer_kwargs(tmp_path, policy_loss=THROWAWAY, epsilon=0.9))
    args = ACPOConfig(**trainer_kwargs(tmp_path, policy_loss=THROWAWAY, max_steps=1))
    trainer = ACPOTrainer(tiny_dir, toy_reward, args=args, train_dataset=toy_dataset(16),
                          processing_class=build_tokenizer())
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    assert trainer.state.global_step == 1 and len(throwaway_method) == 1
    inputs = throwaway_method[0]
    # Its need was met (the z-scores of one group of 4 completions: mean 0), and nothing it did not declare.
    assert inputs.logppl_z.shape == (4,) and abs(float(inputs.logppl_z.sum())) < 1e-4
    assert inputs.entropies is None and inputs.update_pass is None
    assert "throwaway/mean_weight" in trainer.state.log_history[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_built_in_entries_declare_needs_passes_and_validation():
    from types import SimpleNamespace

    from acpo_trl.losses import POLICY_LOSSES, get_policy_loss, register_policy_loss

    assert get_policy_loss("ar_lopti").passes_per_rollout == 2
    assert get_policy_loss("ar_lopti").needs == {"update_pass"}
    assert get_policy_loss("high_entropy").needs == get_policy_loss("low_entropy").needs == {"entropies"}
    assert all(POLICY_LOSSES[name].needs == set() for name in ("acpo", "acpo_log", "ppo_clip", "dapo", "masked_cispo"))
    # A reweighting feeds its base objective: that objective's needs and validation apply too.
    ppl = get_policy_loss("ppl")
    assert ppl.needs_for(SimpleNamespace(reweight_base_loss="dapo")) == {"logppl_z"}
    assert ppl.needs_for(SimpleNamespace(reweight_base_loss="high_entropy")) == {"logppl_z", "entropies"}
    with pytest.raises(ValueError, match="ACPOConfig.entropy_token_fraction=0.0"):
        ppl.validate_config(SimpleNamespace(reweight_c=0.2, reweight_base_loss="high_entropy",
                                            entropy_token_fraction=0.0))
    with pytest.raises(ValueError, match="reweight_base_loss='ar_lopti'"):
        ppl.validate_config(SimpleNamespace(reweight_c=0.2, reweight_base_loss="ar_lopti"))
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("acpo")(lambda inputs, config: None)
    with pytest.raises(ValueError, match="unknown needs"):
        register_policy_loss("x", needs={"gradients"})
