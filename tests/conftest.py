"""Shared fixtures: a tiny model/tokenizer built locally, and trainer factories (TRL is imported once)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tiny_model():
    from acpo_trl.utils.tiny_models import build_tiny_model

    return build_tiny_model(seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The tiny model and tokenizer saved to a folder, for trainers built from a path (as TRL loads models)."""
    from acpo_trl.utils.tiny_models import build_tiny_model

    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = build_tiny_model(seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_vllm_dir(tmp_path_factory):
    """A tiny model vLLM can serve, saved in float32 with its tokenizer: hidden size 128 over 4 heads gives 32-dim
    attention heads, the smallest head size of vLLM's CPU attention (the default tiny model's 16 is refused)."""
    from acpo_trl.utils.tiny_models import build_tiny_model

    path = tmp_path_factory.mktemp("tiny_vllm")
    model, tokenizer = build_tiny_model(seed=0, hidden_size=128)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def trainer_kwargs(tmp_path, **overrides):
    """Small CPU settings shared by the trainer tests."""
    kwargs = dict(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return kwargs
