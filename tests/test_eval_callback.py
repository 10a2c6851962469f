"""EvalCallback in a tiny GRPOTrainer run: metrics logged every N steps, training randomness untouched."""

from __future__ import annotations

import pytest
import torch

from acpo_trl.evaluation.benchmarks import Benchmark
from acpo_trl.evaluation.callback import EvalCallback
from acpo_trl.rewards.common import completion_text
from acpo_trl.utils.tiny_models import build_tiny_model
from acpo_trl.tasks.toy import toy_dataset


def ascii_reward(prompts, completions, **kwargs):
    """Fraction of ASCII characters: about 1/2 for the random tiny model, with variance, so GRPO learns."""
    texts = [completion_text(c) for c in completions]
    return [sum(ch < "\x80" for ch in t) / len(t) if t else 0.0 for t in texts]

from conftest import trainer_kwargs


def _train(tmp_path, with_callback: bool) -> tuple:
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = build_tiny_model(seed=0)
    args = GRPOConfig(**trainer_kwargs(tmp_path, max_steps=4))
    trainer = GRPOTrainer(
        model=model, reward_funcs=ascii_reward, args=args, train_dataset=toy_dataset(32), processing_class=tokenizer
    )
    callback = None
    if with_callback:
        held_out = [Benchmark("toy", toy_dataset(6, seed=1), ascii_reward), Benchmark("toy2", toy_dataset(3, seed=2), ascii_reward)]
        callback = EvalCallback(
            trainer, held_out, eval_steps=2, k=2, temperature=1.0, max_tokens=6, batch_size=4, eval_on_start=True
        )
        trainer.add_callback(callback)
    trainer.train()
    return trainer, callback


@pytest.mark.slow
def test_callback_logs_every_n_steps_and_leaves_training_alone(tmp_path):
    trained, callback = _train(tmp_path / "with", with_callback=True)
    baseline, _ = _train(tmp_path / "without", with_callback=False)

    evals = [entry for entry in trained.state.log_history if "eval/toy/avg@2" in entry]
    assert [entry["step"] for entry in evals] == [0, 2, 4]
    for entry in evals:
        assert set(entry) >= {
            "eval/toy/avg@2", "eval/toy/pass@2", "eval/toy/mean_score", "eval/toy/mean_length",
            "eval/toy/truncation_rate", "eval/toy2/mean_score", "eval/macro/mean_score",
        }  # fmt: skip
        assert 0 < entry["eval/toy/mean_length"] <= 6
        assert entry["eval/macro/mean_score"] == pytest.approx(
            (entry["eval/toy/mean_score"] + entry["eval/toy2/mean_score"]) / 2
        )
    # Each evaluation samples the live model with the same seed: same model, same numbers; changed model, new ones.
    last = {k: v for k, v in evals[-1].items() if k.startswith("eval/")}
    assert callback.evaluate() == last
    with torch.no_grad():
        trained.model.get_input_embeddings().weight.mul_(-3.0)
    assert callback.evaluate() != last

    # Training logs (rewards, losses, ...) are those of the same run without the callback: RNG and metrics intact.
    def train_logs(trainer):
        return [{k: v for k, v in e.items() if not k.startswith("eval/") and k != "step_time"} for e in trainer.state.log_history
                if "loss" in e]  # fmt: skip

    assert train_logs(trained) == train_logs(baseline)
    assert len(train_logs(trained)) == 4 and all(e["grad_norm"] > 0 for e in train_logs(trained))
    assert evals[0]["eval/toy/mean_score"] != evals[2]["eval/toy/mean_score"]  # the model learned in between


def test_callback_rejects_bad_settings(tmp_path):
    class FakeTrainer:
        class args:
            max_completion_length = 8

    with pytest.raises(ValueError, match="`eval_steps` must be >= 1"):
        EvalCallback(FakeTrainer(), [Benchmark("toy", toy_dataset(2), ascii_reward)], eval_steps=0)
    with pytest.raises(ValueError, match="`benchmarks` is empty"):
        EvalCallback(FakeTrainer(), [], eval_steps=1)
    with pytest.raises(ValueError, match=r"SamplingSettings.sampler='gumbel': use one of \('multinomial', 'coupled'\)"):
        EvalCallback(FakeTrainer(), [Benchmark("toy", toy_dataset(2), ascii_reward)], eval_steps=1, sampler="gumbel")
