"""Every shipped recipe trains: each ``configs/<task>/*.yaml`` paper recipe and each ``configs/study/*.yaml`` runs
through ``acpo-train --config <recipe>`` (its parser, input checks and ``run``, in process) for two optimizer updates
of one rollout, changing only what a CPU forces:

- the model: a tiny, locally built model of the recipe model's architecture, with a byte-level tokenizer that has a
  chat template (plain-text ``base`` prompts and chat prompts both work);
- the sizes: num_generations, the micro-batch, the lengths, and gradient_accumulation_steps / steps_per_generation
  divided by the same factor, so that the updates per rollout (and so the regime) stay the recipe's;
- the data: a few short prompts per task, from ``tests/fixtures`` (a few rows of each sample, their source and
  licence beside them), or from the full samples in ``$ACPO_DATA_DIR`` (a folder laid out like ``../shared/data``);
- vLLM and bf16 off (``use_cpu``), two steps, a temporary output_dir, no checkpoints, no progress bar;
- the reward: a random tiny model earns none, and a group of equal rewards has zero advantage, so zero gradient and
  a vacuous update. Each of the recipe's reward functions runs as written (its scores are checked), and the test adds
  a tie-breaker below 1e-3 from a hash of each completion, so that every update has a gradient.

Every other field runs as written (policy loss and its fields, loss_type, dual-clip, templates, rewards,
scale_rewards, dtype, learning rate, ...): the test compares the parsed configuration with the recipe's.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import yaml

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
STUDY = CONFIGS / "study"
RECIPES = sorted(p for task in ("math", "hitab", "countdown") for p in (CONFIGS / task).glob("*.yaml"))
RECIPES += sorted(STUDY.glob("*.yaml"))
#: The data: the few rows per task in ``tests/fixtures`` (their READMEs give source, licence and the rows taken), or,
#: with ``ACPO_DATA_DIR`` set, the full samples in that folder, laid out like ``../shared/data`` (its READMEs say
#: where each sample comes from).
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DATA = Path(os.environ.get("ACPO_DATA_DIR") or FIXTURES).resolve()
#: Each sample's path (a glob) under the data folder: (in tests/fixtures, in a folder laid out like ../shared/data).
FILES = {
    "orz": ("math/orz.json", "orz_math_57k/orz_math_57k_collected.first1785.json"),
    "countdown_train": ("countdown/train_nums_target.jsonl", "countdown/train_nums_target.jsonl"),
    "countdown_test": ("countdown/test_nums_target.jsonl", "countdown/test_nums_target.jsonl"),
    "hitab_train": ("hitab/train_processed_samples.jsonl", "hitab/train_processed_subset/*.jsonl"),
    "hitab_tables": ("hitab/tables", "hitab/tables/raw"),
    "hitab_test": ("hitab/test_samples.jsonl", "hitab/test_samples.jsonl"),
}

#: The architecture of each recipe's model (``config.architectures[0]`` of the real checkpoint); a recipe with a model
#: not listed here fails, so that a new model gets a tiny stand-in of its own architecture.
ARCHITECTURES = {
    "Qwen/Qwen2.5-7B": "Qwen2ForCausalLM",
    "Qwen/Qwen2.5-3B": "Qwen2ForCausalLM",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen2ForCausalLM",
    "offline:smollm2": "LlamaForCausalLM",  # SmolLM2-135M-Instruct (acpo_trl/utils/offline_model.py)
    "outputs/warmup/smollm2_running_sum": "LlamaForCausalLM",  # its acpo-warmup checkpoint (the recipe says how)
}

# What the CPU forces, identical for every recipe.
NUM_GENERATIONS = 2
MICRO_BATCH = 2  # per_device_train_batch_size: completions per micro-step
MAX_COMPLETION_LENGTH = 8
#: The recipes' max_prompt_length counts Qwen tokens (about 4 bytes of text each); the tiny tokenizer spends a token
#: per byte, so the same prompts need a larger limit (HiTab's linearised tables are 1.3k bytes and more).
MAX_PROMPT_BYTES = 2048
STEPS = 2  # optimizer updates, all from the first rollout
#: Distinct prompts per task slice: the most a rollout draws (off-policy recipes: a micro-batch of 2 x 16 steps per
#: generation over 2 completions per prompt = 16 prompts; TRL's sampler drops an incomplete batch of prompts).
MIN_PROMPTS = 16
#: Fields the test sets; every other parsed field must be the recipe's. ``generation_batch_size`` follows from
#: per_device_train_batch_size x steps_per_generation.
OVERRIDDEN = {
    "model_name_or_path", "dataset_name", "hitab_tables_dir", "eval_dataset_name", "num_generations",
    "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size",
    "max_completion_length", "max_prompt_length", "use_vllm", "bf16", "use_cpu", "max_steps", "output_dir",
    "save_strategy", "disable_tqdm",
}


def recipe_id(path: Path) -> str:
    return str(path.relative_to(CONFIGS))


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """One tiny model per architecture (``acpo_trl.utils.tiny_models``), saved with the byte-level chat tokenizer."""
    from acpo_trl.utils.tiny_models import TINY_ARCHITECTURES, build_tokenizer

    out = {}
    for architecture, build in TINY_ARCHITECTURES.items():
        tokenizer = build_tokenizer()
        model = build(tokenizer, hidden_size=32, num_layers=2, max_position_embeddings=4096)
        assert type(model).__name__ == architecture
        path = tmp_path_factory.mktemp(architecture)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[architecture] = str(path)
    return out


def _write_jsonl(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def data_paths(name: str) -> list[str]:
    """The files (or folder) of sample ``name`` (``FILES``) under ``DATA``."""
    pattern = FILES[name][0 if DATA == FIXTURES else 1]
    paths = sorted(glob.glob(str(DATA / pattern)))
    assert paths, f"no {DATA / pattern}: ACPO_DATA_DIR must be a folder laid out like ../shared/data"
    return paths


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """task -> the data fields pointing at a slice of the task's sample: 16 to 40 records with short prompts."""
    from acpo_trl.data.hitab import load_hitab

    out = tmp_path_factory.mktemp("samples")
    [orz_path] = data_paths("orz")
    orz = [r for r in json.loads(Path(orz_path).read_text()) if len(r[0]["value"]) < 500][:40]
    math_path = out / "orz.json"
    math_path.write_text(json.dumps(orz))

    [countdown_path], [countdown_test_path] = data_paths("countdown_train"), data_paths("countdown_test")
    countdown = Path(countdown_path).read_text().splitlines()[:40]
    countdown_held_out = Path(countdown_test_path).read_text().splitlines()

    [tables] = data_paths("hitab_tables")
    shards = data_paths("hitab_train")
    records = [json.loads(line) for shard in shards for line in Path(shard).read_text().splitlines()]
    prompts = load_hitab(shards, tables)["prompt"]
    short = [r for r, p in zip(records, prompts) if len(p.encode()) <= MAX_PROMPT_BYTES * 3 // 4][:24]
    [hitab_test_path] = data_paths("hitab_test")
    held_out = Path(hitab_test_path).read_text().splitlines()[:4]
    for task, rows in (("math", orz), ("countdown", countdown), ("hitab", short)):
        assert len(rows) >= MIN_PROMPTS, f"{len(rows)} short {task} prompts under {DATA}, fewer than {MIN_PROMPTS}"
    return {
        "math": {"dataset_name": str(math_path)},
        "countdown": {"dataset_name": _write_jsonl(out / "countdown.jsonl", map(json.loads, countdown)),
                      "eval_dataset_name": _write_jsonl(out / "countdown_test.jsonl",
                                                        map(json.loads, countdown_held_out[:8]))},
        "hitab": {"dataset_name": _write_jsonl(out / "hitab.jsonl", short), "hitab_tables_dir": tables,
                  "eval_dataset_name": _write_jsonl(out / "hitab_test.jsonl", map(json.loads, held_out))},
    }


def parse(path: Path, overrides: dict):
    from acpo_trl.recipe import make_parser

    args = ["--config", str(path)]
    for key, value in overrides.items():
        args += [f"--{key}", str(value)]
    return make_parser().parse_args_and_config(args=args)


def toy_size_overrides(path: Path, recipe: dict, models: dict, samples: dict, output_dir: Path) -> dict:
    """The CPU's overrides of one recipe (its YAML as a dict)."""
    task = recipe["task"]
    factor = recipe.get("gradient_accumulation_steps", 1)
    spg = recipe.get("steps_per_generation", factor)
    assert spg % factor == 0, f"{recipe_id(path)}: steps_per_generation {spg} is not a multiple of {factor}"
    prompts = MICRO_BATCH * (spg // factor) // NUM_GENERATIONS
    assert prompts <= MIN_PROMPTS, f"{recipe_id(path)}: {prompts} prompts per rollout, more than {MIN_PROMPTS}"
    overrides = {
        "model_name_or_path": models[ARCHITECTURES[recipe["model_name_or_path"]]],
        "num_generations": NUM_GENERATIONS,
        "per_device_train_batch_size": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": spg // factor,  # same updates per rollout with one micro-step per update
        "max_completion_length": MAX_COMPLETION_LENGTH,
        "use_vllm": "false",
        "bf16": "false",
        "use_cpu": "true",
        "max_steps": STEPS,
        "output_dir": output_dir,
        "save_strategy": "no",
        "disable_tqdm": "true",
    }
    if recipe.get("max_prompt_length") is not None:
        overrides["max_prompt_length"] = MAX_PROMPT_BYTES
    # A recipe that reads a dataset reads the sample; one that generates its tasks keeps generating them.
    if "dataset_name" in recipe:
        overrides.update({k: v for k, v in samples[task].items() if k == "dataset_name" or k in recipe})
    return overrides


def with_tie_breaker(func, scores: list):
    """``func`` (a TRL reward callable) plus below 1e-3 from a hash of each completion; ``func``'s own scores are
    appended to ``scores``."""

    def reward(prompts, completions, **columns):
        own = func(prompts, completions, **columns)
        scores.extend(own)
        tie = [int(hashlib.sha256(repr(c).encode()).hexdigest()[:8], 16) / 16**8 * 1e-3 for c in completions]
        return [None if s is None else s + t for s, t in zip(own, tie)]

    reward.__name__ = getattr(func, "__name__", type(func).__name__)
    return reward


def fields(parsed) -> dict:
    script_args, training_args, model_args = parsed
    out = {}
    for group in (vars(script_args), training_args.to_dict(), vars(model_args)):
        out.update({k: v for k, v in group.items() if k not in OVERRIDDEN})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_recipe_trains_at_toy_size(path, tiny_models, samples, tmp_path, monkeypatch):
    from acpo_trl import run as running
    from acpo_trl.run import check_inputs, run
    from acpo_trl.trainer import ACPOTrainer

    recipe = yaml.safe_load(path.read_text())
    overrides = toy_size_overrides(path, recipe, tiny_models, samples, tmp_path / "out")
    assert set(overrides) <= OVERRIDDEN
    script_args, training_args, model_args = parsed = parse(path, overrides)
    as_written = parse(path, {"use_cpu": "true"})  # bf16 without a GPU is refused unless the arguments say CPU
    assert fields(parsed) == fields(as_written), "a field other than the CPU's changed"
    upr = as_written[1].updates_per_rollout
    assert training_args.updates_per_rollout == upr > 1 and not training_args.is_on_policy
    assert STEPS <= upr  # both updates come from the first rollout

    rollouts = []
    generate_and_score = ACPOTrainer._generate_and_score_completions

    def recorded(self, inputs):
        output = generate_and_score(self, inputs)
        rollouts.append(output.get("old_per_token_logps") is not None)
        return output

    monkeypatch.setattr(ACPOTrainer, "_generate_and_score_completions", recorded)
    scores: list = []
    build_task = running.build_task

    def build_tie_broken_task(*args, **kwargs):
        task = build_task(*args, **kwargs)
        task.reward_funcs = [with_tie_breaker(f, scores) for f in task.reward_funcs]
        return task

    monkeypatch.setattr(running, "build_task", build_tie_broken_task)
    check_inputs(script_args, training_args, model_args)
    trainer = run(script_args, training_args, model_args)

    assert trainer.state.global_step == STEPS
    assert type(trainer.model).__name__ == ARCHITECTURES[recipe["model_name_or_path"]]
    # One rollout fed both updates, and it kept the rollout policy's log-probs: the second update is off-policy.
    assert rollouts == [True]
    logged = [e for e in trainer.state.log_history if "policy_loss" in e]
    assert [e["step"] for e in logged] == list(range(1, STEPS + 1))
    # The recipe's rewards scored every completion of the rollout (a float, or None where a reward does not apply).
    assert len(scores) >= NUM_GENERATIONS and all(s is None or math.isfinite(s) for s in scores)
    for entry in logged:
        assert math.isfinite(entry["loss"]) and math.isfinite(entry["policy_loss"]), entry
        assert entry["grad_norm"] > 0, entry  # a real update, not a zero-advantage no-op
        if training_args.policy_loss in ("acpo", "acpo_log"):  # the method's own clip ranges, per bin
            assert any(key.startswith("acpo/bin") and value is not None for key, value in entry.items()), entry
