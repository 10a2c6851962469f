"""use_vllm=True without a GPU: one clear line at trainer construction, before the model or an engine is built
(issue 15.4). Needs no vLLM: the refusal comes first, whether vLLM is installed or not."""

from __future__ import annotations

import pytest
import torch

from conftest import trainer_kwargs

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the refusal is for machines without a GPU; to check it here, hide the GPU: CUDA_VISIBLE_DEVICES= pytest",
)


@pytest.mark.parametrize(
    "vllm_settings",
    [
        {"vllm_mode": "colocate"},
        {"vllm_mode": "colocate", "vllm_enable_sleep_mode": True},
        {"vllm_mode": "server", "vllm_server_host": "127.0.0.1"},
    ],
    ids=["colocate", "colocate-sleep", "server"],
)
def test_use_vllm_without_a_gpu_is_refused_at_construction_in_one_line(tmp_path, vllm_settings):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    args = ACPOConfig(**trainer_kwargs(tmp_path, use_vllm=True, **vllm_settings))
    # a model path that does not exist: the refusal must come before TRL loads anything
    with pytest.raises(ValueError) as error:
        ACPOTrainer(str(tmp_path / "no-model-here"), reward_funcs=toy_reward, args=args, train_dataset=toy_dataset(4))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("use_vllm=True needs a GPU")
    for what_to_do in ("use_vllm=False", "acpo-eval --backend vllm", "server mode", "sleep mode"):
        assert what_to_do in message

