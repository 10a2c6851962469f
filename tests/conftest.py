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


def write_toy_recipe(folder, tiny_dir: str, **overrides) -> str:
    """An acpo-train recipe of the tiny local model on the toy task (CPU, 4 steps, 2 updates per rollout), with
    ``overrides``, written to ``folder/recipe.yaml``; returns its path."""
    import yaml
    from pathlib import Path

    config = {
        "model_name_or_path": tiny_dir, "task": "toy", "num_train_tasks": 64, "num_eval_tasks": 4, "eval_k": 2,
        "output_dir": str(Path(folder) / "out"), "use_cpu": True, "bf16": False, "per_device_train_batch_size": 8,
        "num_generations": 4, "steps_per_generation": 2, "max_completion_length": 8, "learning_rate": 0.01,
        "max_steps": 4, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0,
        "disable_tqdm": True, **overrides,
    }  # fmt: skip
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)
