"""ACPOTrainer with use_vllm=True (colocate) executed for real with vLLM's CPU build (issue 15.4).

On CPU the package refuses use_vllm (``acpo_trl.utils.vllm_check``): TRL's weight sync needs a GPU build of vLLM. To run
the trainer's own vLLM code path here anyway, the fixture lifts that refusal and substitutes, in the test only:
- the weight sync: vLLM's CPU build re-packs its linear weights and drops the ``weight_loader`` TRL's sync calls,
  so the weights are reloaded through the model runner (``reload_weights``, which re-packs them), the tied
  ``lm_head`` is re-packed from the reloaded embedding (it keeps a packed copy that the reload does not refresh:
  without this step the sync is silently wrong), and the prefix cache is reset, as TRL does;
- the engine's dtype: TRL builds the engine with vLLM's ``dtype="auto"``, which runs a float32 checkpoint in
  bfloat16; float32 here, so that vLLM's sampling log-probs equal the trainer's.
"""

from __future__ import annotations

import functools
import gc
import os

import pytest

vllm = pytest.importorskip(
    "vllm", reason="needs vLLM: .ci/run installs its CPU build in a second venv (docs/evaluation.md)"
)

import torch  # noqa: E402

from conftest import trainer_kwargs  # noqa: E402


def cpu_sync_weights(self):
    """``trl.generation.vllm_generation.VLLMGeneration.sync_weights`` for vLLM's CPU build, colocate mode."""
    runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
    lm_head = runner.get_model().lm_head
    lm_head.quant_method.process_weights_after_loading(lm_head)
    self.llm.reset_prefix_cache()


@pytest.fixture
def vllm_on_cpu(monkeypatch):
    import trl.generation.vllm_generation as vllm_generation

    monkeypatch.setattr("acpo_trl.trainer.check_vllm_device", lambda args: None)
    monkeypatch.setattr(vllm_generation.VLLMGeneration, "sync_weights", cpu_sync_weights)
    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm.LLM, dtype="float32"))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; unset, vLLM's CPU build refuses to start
    monkeypatch.setenv("VLLM_CPU_CI_ENV", "1")  # no inductor compile (~100 s per engine)
    set_by_trl = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT")}
    yield
    gc.collect()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()  # the colocated engine's process group
    for name, value in set_by_trl.items():  # TRL sets them for that group
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _recording(trainer, name, record):
    """Wrap ``trainer.<name>`` so that ``record(args, result)`` sees every call."""
    original = getattr(trainer, name)

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        record(args, result)
        return result

    setattr(trainer, name, wrapper)


@pytest.mark.slow
def test_colocated_vllm_training_matches_transformers_generation_on_the_same_completions(tiny_vllm_dir, tmp_path,
                                                                                           vllm_on_cpu):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    # 3 optimizer steps, 2 per rollout (num_iterations: the whole rollout each time, so that TRL's shuffle of a
    # rollout into micro-batches, which draws from an RNG that vLLM reseeds, does not matter): the second rollout is
    # sampled after 2 updates and a weight sync. The first update of a rollout has ratio 1 and a loss of ~0 (the
    # group-normalised advantages cancel); beta > 0 makes the third step's loss non-zero (KL to the initial model).
    settings = trainer_kwargs(tmp_path, max_steps=3, num_iterations=2, beta=0.1, policy_loss="acpo")

    def train(use_vllm: bool, completions: list | None):
        args = ACPOConfig(**settings, use_vllm=use_vllm, vllm_mode="colocate", vllm_importance_sampling_correction=True)
        trainer = ACPOTrainer(tiny_vllm_dir, reward_funcs=toy_reward, args=args, train_dataset=toy_dataset(16))
        rollouts, losses = [], []
        if completions is None:
            _recording(trainer, "_generate_single_turn", lambda a, result: rollouts.append((a[0], result[0])))
        else:  # replay the vLLM completions, on the same prompts
            def replay(prompt_ids, *args, **kwargs):
                recorded_prompts, recorded_completions = completions.pop(0)
                assert prompt_ids == recorded_prompts
                return recorded_completions, None

            trainer._generate_single_turn = replay
        _recording(trainer, "_compute_loss", lambda a, loss: losses.append(loss.item()))
        trainer.train()
        return trainer, rollouts, losses

    vllm_trainer, rollouts, vllm_losses = train(use_vllm=True, completions=None)
    assert vllm_trainer.vllm_generation.llm.llm_engine.vllm_config.model_config.dtype == torch.float32
    assert len(rollouts) == 2 and vllm_trainer.state.global_step == 3
    sampling = [h for h in vllm_trainer.state.log_history if "sampling/importance_sampling_ratio/min" in h]
    assert len(sampling) == 2  # one per rollout, the second after the weights moved
    for logs in sampling:
        assert abs(logs["sampling/importance_sampling_ratio/min"] - 1) < 1e-4
        assert abs(logs["sampling/importance_sampling_ratio/max"] - 1) < 1e-4
    del vllm_trainer

    _, _, transformers_losses = train(use_vllm=False, completions=list(rollouts))
    assert len(vllm_losses) == len(transformers_losses) == 3
    torch.testing.assert_close(torch.tensor(vllm_losses), torch.tensor(transformers_losses), rtol=1e-4, atol=1e-5)
    assert min(abs(loss) for loss in vllm_losses[1:]) > 1e-3
