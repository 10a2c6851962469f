"""The paper recipes (configs/<task>/*.yaml) and accelerate configs: they parse with acpo-train's own parser, their
batch arithmetic is the paper's (its regimes table), methods differ by one line, and configs/make_recipes.py wrote them."""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from acpo_trl.recipe import make_parser

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ACCELERATE = CONFIGS / "accelerate"
STUDY = CONFIGS / "study"  # the study's real-model recipe: tests/test_study.py
RECIPES = sorted(p for p in CONFIGS.glob("*/*.yaml") if p.parent not in (ACCELERATE, STUDY))

# The paper's regimes table: regime -> prompts per rollout, prompts per optimizer update, updates per rollout.
PAPER = {"near_on_policy": (128, 64, 2), "off_policy": (256, 16, 16)}
GROUP_SIZE = 10
MATH_METHODS = ["acpo", "acpo_log", "grpo", "dapo", "cispo", "high_entropy", "low_entropy", "ar_lopti", "dlogp_reweight"]
POLICY_LOSS = {"grpo": "ppo_clip", "cispo": "masked_cispo"}  # file name -> policy_loss where they differ
MODELS = {"qwen2.5-3b": "Qwen/Qwen2.5-3B", "qwen2.5-7b": "Qwen/Qwen2.5-7B"}
NAME = re.compile(r"(?P<model>qwen2\.5-\d+b)_(?P<method>\w+?)_(?P<regime>near_on_policy|off_policy)")
# Fields that name the run rather than configure it.
RUN_NAMING = {"output_dir", "run_name", "logging_dir"}


def name_parts(path: Path) -> dict[str, str]:
    match = NAME.fullmatch(path.stem)
    assert match, f"{path.name}: expected <model>_<method>_<regime>.yaml"
    return match.groupdict()


@lru_cache(maxsize=None)
def parse(path: Path, *overrides: str):
    # bf16 on a machine without a GPU is refused unless the arguments say CPU.
    return make_parser().parse_args_and_config(args=["--config", str(path), "--use_cpu", "true", *overrides])


def accelerate_config(name: str) -> dict:
    return yaml.safe_load((ACCELERATE / f"{name}.yaml").read_text())


NUM_PROCESSES = accelerate_config("multi_gpu")["num_processes"]  # the recipes' documented launch: one node


def prompts(training_args, num_processes: int) -> tuple[float, float]:
    """(prompts per rollout, prompts per optimizer update) when launched on ``num_processes`` processes."""
    assert training_args.world_size == 1  # the test process: ACPOConfig sized the generation batch for 1
    per_rollout = training_args.generation_batch_size * num_processes / training_args.num_generations
    per_update = (training_args.per_device_train_batch_size * num_processes
                  * training_args.gradient_accumulation_steps / training_args.num_generations)
    return per_rollout, per_update


def test_the_recipe_set():
    expected = {f"math/qwen2.5-7b_{method}_{regime}.yaml" for method in MATH_METHODS for regime in PAPER}
    expected |= {f"{task}/{model}_acpo_{regime}.yaml"
                 for task in ("countdown", "hitab") for model in MODELS for regime in PAPER}
    assert {str(p.relative_to(CONFIGS)) for p in RECIPES} == expected


def load_make_recipes():
    spec = importlib.util.spec_from_file_location("make_recipes", CONFIGS / "make_recipes.py")
    make_recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_recipes)
    return make_recipes


def test_recipes_are_what_the_generator_writes():
    make_recipes = load_make_recipes()
    generated = make_recipes.recipes()
    assert sorted(generated) == RECIPES
    stale = [str(p.relative_to(CONFIGS)) for p, text in generated.items() if p.read_text() != text]
    assert not stale, f"rerun `python configs/make_recipes.py`: {stale}"
    assert make_recipes.NUM_PROCESSES == NUM_PROCESSES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_batch_arithmetic_is_the_papers(path):
    parts = name_parts(path)
    _, training_args, _ = parse(path)
    per_rollout, per_update, updates = PAPER[parts["regime"]]
    assert training_args.num_generations == GROUP_SIZE
    assert prompts(training_args, NUM_PROCESSES) == (per_rollout, per_update)
    # ar_lopti passes over each rollout twice (low-, then high-probability tokens): twice the updates.
    assert training_args.updates_per_rollout == updates * (2 if parts["method"] == "ar_lopti" else 1)
    assert not training_args.is_on_policy


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_method_model_and_shared_setup(path):
    parts = name_parts(path)
    script_args, training_args, model_args = parse(path)
    assert path.parent.name == script_args.task
    assert training_args.policy_loss == POLICY_LOSS.get(parts["method"], parts["method"])
    assert model_args.model_name_or_path == MODELS[parts["model"]]
    assert model_args.dtype == "float32" and training_args.bf16  # fp32 master weights, bf16 compute
    assert script_args.prompt_template == "base"
    expected = {
        "learning_rate": 1e-6, "lr_scheduler_type": "constant", "weight_decay": 0.01, "max_grad_norm": 1.0,
        "num_train_epochs": 15, "max_completion_length": 3072, "temperature": 1.0, "top_p": 1.0, "beta": 0.0,
        "entropy_coef": 0.0, "loss_type": "grpo", "scale_rewards": "group", "dual_clip_c": 3.0,
        "mask_truncated_completions": False, "use_vllm": True, "vllm_mode": "colocate",
        "vllm_importance_sampling_correction": True, "vllm_max_model_length": 1024 + 3072,
        "output_dir": f"outputs/{path.parent.name}/{path.stem}",
    }
    actual = {key: getattr(training_args, key) for key in expected}
    actual["lr_scheduler_type"] = str(getattr(actual["lr_scheduler_type"], "value", actual["lr_scheduler_type"]))
    assert actual == expected


def comparable(parsed) -> list[dict]:
    script_args, training_args, model_args = parsed
    return [vars(script_args), {k: v for k, v in training_args.to_dict().items() if k not in RUN_NAMING},
            vars(model_args)]


@pytest.mark.parametrize("path", [p for p in RECIPES if name_parts(p)["method"] != "acpo"],
                         ids=lambda p: str(p.relative_to(CONFIGS)))
def test_a_method_is_the_acpo_recipe_with_another_policy_loss(path):
    """The comparison table is rerun by changing `policy_loss` and the method's own fields (the paper's values,
    e.g. DAPO's epsilon_high 0.3) in the ACPO recipe of the same regime."""
    parts = name_parts(path)
    acpo = path.with_name(f"{parts['model']}_acpo_{parts['regime']}.yaml")
    method = parse(path)
    fields = load_make_recipes().method_fields(parts["method"])
    flags = [item for name, value in fields.items() for item in (f"--{name}", str(value))]
    switched = parse(acpo, *flags)
    assert comparable(switched) == comparable(method)


# docs/recipes.md, "Other GPU counts": processes -> regime -> overrides that keep the paper's numbers.
DOCUMENTED_OVERRIDES = {
    16: {"near_on_policy": ["--per_device_train_batch_size", "5"],
         "off_policy": ["--per_device_train_batch_size", "5"]},
    4: {"near_on_policy": ["--gradient_accumulation_steps", "16", "--steps_per_generation", "32"],
        "off_policy": ["--gradient_accumulation_steps", "4", "--steps_per_generation", "64"]},
    1: {"near_on_policy": ["--gradient_accumulation_steps", "64", "--steps_per_generation", "128"],
        "off_policy": ["--gradient_accumulation_steps", "16", "--steps_per_generation", "256"]},
}


@pytest.mark.parametrize("regime", PAPER)
@pytest.mark.parametrize("num_processes", DOCUMENTED_OVERRIDES)
def test_the_documented_overrides_for_other_gpu_counts(num_processes, regime):
    assert accelerate_config("multi_node")["num_processes"] == 16
    assert accelerate_config("single_gpu")["num_processes"] == 1
    per_rollout, per_update, updates = PAPER[regime]
    recipe = CONFIGS / f"math/qwen2.5-7b_acpo_{regime}.yaml"
    _, training_args, _ = parse(recipe, *DOCUMENTED_OVERRIDES[num_processes][regime])
    assert prompts(training_args, num_processes) == (per_rollout, per_update)
    assert training_args.updates_per_rollout == updates


def test_the_docs_table_lists_every_recipe_with_its_updates_per_rollout():
    docs = (CONFIGS.parent / "docs/recipes.md").read_text()
    rows = re.findall(r"^\|.*\| `configs/(\S+\.yaml)` \| (\d+) \|$", docs, re.M)
    assert {CONFIGS / path: int(updates) for path, updates in rows} == {
        path: parse(path)[1].updates_per_rollout for path in RECIPES}


def test_the_commented_vllm_server_block_parses(tmp_path):
    path = CONFIGS / "math/qwen2.5-7b_acpo_near_on_policy.yaml"
    text = re.sub(r"^# (vllm_\w+: )", r"\1", path.read_text(), flags=re.M)
    text = text.replace("vllm_mode: colocate", "", 1)
    uncommented = tmp_path / path.name
    uncommented.write_text(text)
    _, training_args, _ = parse(uncommented)
    assert (training_args.vllm_mode, training_args.vllm_server_host) == ("server", "10.0.0.2")


ACCELERATE_CONFIGS = {
    # name: distributed_type, num_machines, num_processes, DeepSpeed ZeRO stage, use_cpu
    "single_gpu": ("NO", 1, 1, None, False),
    "multi_gpu": ("MULTI_GPU", 1, 8, None, False),
    "deepspeed_zero2": ("DEEPSPEED", 1, 8, 2, False),
    "deepspeed_zero3": ("DEEPSPEED", 1, 8, 3, False),
    "multi_node": ("DEEPSPEED", 2, 16, 3, False),
    # MULTI_GPU selects accelerate's torchrun launcher; use_cpu keeps both processes on CPU (see the file).
    "cpu_2proc": ("MULTI_GPU", 1, 2, None, True),
    # DeepSpeed on CPU: use_cpu must stay false (accelerate turns DeepSpeed off for a cpu state; see the file).
    "deepspeed_zero2_cpu": ("DEEPSPEED", 1, 2, 2, False),
    "deepspeed_zero3_cpu": ("DEEPSPEED", 1, 2, 3, False),
}


def test_the_accelerate_config_set():
    assert {p.stem for p in ACCELERATE.glob("*.yaml")} == set(ACCELERATE_CONFIGS)


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_accelerate_config(name):
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(ACCELERATE / f"{name}.yaml"))  # accelerate's loader rejects unknown keys
    distributed_type, num_machines, num_processes, zero_stage, use_cpu = ACCELERATE_CONFIGS[name]
    assert str(loaded.distributed_type).split(".")[-1] == distributed_type
    assert (loaded.num_machines, loaded.num_processes, loaded.use_cpu) == (num_machines, num_processes, use_cpu)
    assert (loaded.deepspeed_config or {}).get("zero_stage") == zero_stage
    assert loaded.mixed_precision == ("no" if use_cpu or name.endswith("_cpu") else "bf16")
    if num_machines > 1:
        assert loaded.main_process_ip and loaded.main_process_port
