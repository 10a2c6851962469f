"""Write the paper recipes under configs/{math,countdown,hitab}/ from one template, so that they cannot drift.

    python configs/make_recipes.py           # (re)write every recipe
    python configs/make_recipes.py --check   # exit 1 if a committed recipe differs from what this script writes

Every recipe is the ACPO paper's setup (Wang et al. 2026, arXiv 2606.22570: its regimes table, README "Regimes") for one task, model, regime
and policy loss. Files of one task x model x regime differ only in `policy_loss`, the method's own fields (the
paper's values, ACPOConfig's defaults where they agree) and `output_dir`; tests/test_recipes.py checks that and the
batch arithmetic.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

from acpo_trl import ACPOConfig

CONFIGS = Path(__file__).resolve().parent

NUM_PROCESSES = 8  # one node of 8 GPUs: configs/accelerate/{multi_gpu,deepspeed_zero2,deepspeed_zero3}.yaml
GROUP_SIZE = 10  # completions per prompt (num_generations)
PROMPTS_PER_MICRO_STEP = 8  # over all processes: a global micro-batch of 80 completions, 10 per GPU
# regime -> (prompts per rollout, prompts per optimizer update): the paper's off-policy degree
REGIMES = {"near_on_policy": (128, 64), "off_policy": (256, 16)}
REGIME_TITLES = {"near_on_policy": "near on-policy", "off_policy": "off-policy"}

# method (file name) -> (policy_loss, the fields it reads that the recipe writes out, the paper's values where they
# are not ACPOConfig's defaults). Every other value is read from ACPOConfig (method_fields), so none is typed twice.
METHODS = {
    "acpo": ("acpo", ("acpo_num_bins", "acpo_alpha", "epsilon", "acpo_clip_min", "acpo_clip_max", "acpo_stats_scope"),
             {}),
    "acpo_log": ("acpo_log", ("acpo_num_bins", "acpo_alpha", "epsilon", "acpo_clip_min", "acpo_clip_max",
                              "acpo_stats_scope"), {}),
    "grpo": ("ppo_clip", ("epsilon",), {}),
    # the ACPO authors' launcher runs every PPO-style baseline at 0.2 / 0.3 (the DAPO paper's 0.28 is dapo's default)
    "dapo": ("dapo", ("epsilon", "epsilon_high"), {"epsilon_high": 0.3}),
    "cispo": ("masked_cispo", ("cispo_clip_max", "epsilon", "epsilon_high"), {"epsilon_high": 0.3}),
    "high_entropy": ("high_entropy", ("entropy_token_fraction", "epsilon", "epsilon_high"), {"epsilon_high": 0.3}),
    "low_entropy": ("low_entropy", ("entropy_token_fraction", "epsilon", "epsilon_high"), {"epsilon_high": 0.3}),
    "ar_lopti": ("ar_lopti", ("ar_weight_c", "lopti_prob_threshold", "epsilon", "epsilon_high"), {"epsilon_high": 0.24}),
    "dlogp_reweight": ("dlogp_reweight", ("reweight_c", "reweight_base_loss", "epsilon", "epsilon_high"),
                       {"epsilon_high": 0.3}),
}


def method_fields(method: str) -> dict:
    """``policy_loss`` and the recipe's method fields of ``method``: the paper's value, else ACPOConfig's default."""
    policy_loss, names, paper = METHODS[method]
    defaults = {spec.name: spec.default for spec in fields(ACPOConfig)}
    return {"policy_loss": policy_loss, **{name: paper.get(name, defaults[name]) for name in names}}


METHOD_NOTES = {
    "acpo": "bin-wise adaptive clipping, the paper's run (not the reference YAML's alpha 1, min 0.05, max 0.5)",
    "acpo_log": "THIS PACKAGE'S VARIANT, not in the paper: ACPO's bins, eps_b from the within-bin std of log r, r clipped "
                "to [e^-eps_b, e^eps_b], so the lower clip never vanishes (the paper's alpha, base and clamp)",
    "grpo": "GRPO = TRL's fixed clip [0.8, 1.2], plus the shared dual-clip",
    "dapo": "clip-higher only, epsilon_high 0.3 as the ACPO authors ran it (the DAPO paper, dapo's default when unset: "
            "0.28, with dynamic sampling)",
    "cispo": "the ACPO authors' CISPO: detached clamp(r, 0, 1.45), tokens outside (0.8, 1.3) dropped, no dual-clip",
    "high_entropy": "clip [0.8, 1.3] (the authors' launcher's, as for every PPO-style baseline) on the top 20% "
                    "highest-entropy tokens of each sequence",
    "low_entropy": "clip [0.8, 1.3] on the bottom 80% of each sequence by entropy (k = max(1, int(0.8 n)) tokens)",
    "ar_lopti": "A' = (0.3 p_old + 0.7) A; pass 1 on tokens with p_old < 0.5, pass 2 on the others. ACPOConfig "
                "sets num_iterations=2 itself: TWICE the optimizer updates per rollout of the other methods",
    "dlogp_reweight": "A' = (1 + 0.2 (1 - p_old)) A fed to this table's DAPO (0.2/0.3, dual-clip 3), so that it "
                      "differs from `dapo` in the reweighting only (the Δlog p paper: 0.28, c = 10, dynamic sampling)",
}

MODELS = {"qwen2.5-3b": "Qwen/Qwen2.5-3B", "qwen2.5-7b": "Qwen/Qwen2.5-7B"}
# full fine-tuning: ZeRO-2 fits 3B, 7B needs ZeRO-3 (DDP needs ~16 bytes per parameter on every GPU)
ACCELERATE = {"qwen2.5-3b": "deepspeed_zero2", "qwen2.5-7b": "deepspeed_zero3"}
# task -> (title, script-argument lines)
TASKS = {
    "math": ("Math (ORZ-57K)", """\
task: math
dataset_name: Tonic/OpenReasonerZero  # ORZ-57K (Hub mirror), or a local copy of orz_math_57k_collected.json
prompt_template: base  # the ORZ "A conversation between User and Assistant ..." prompt, no chat template
"""),
    "countdown": ("Countdown", """\
task: countdown
dataset_name: Jiayi-Pan/Countdown-Tasks-3to4
dataset_train_split: train[:8001]  # TinyZero's train rows (or a local .jsonl/.parquet of {target, nums})
eval_dataset_name: Jiayi-Pan/Countdown-Tasks-3to4  # held-out set of `--report true`
dataset_test_split: train[8001:10002]  # TinyZero's test rows
prompt_template: base
countdown_format_score: 0.0  # the ACPO authors score 1 or 0 (TinyZero: 0.1)
"""),
    "hitab": ("HiTab", """\
task: hitab
# EDIT: paths in a clone of github.com/microsoft/HiTab, after `unzip -d data/ data/tables.zip` in it
dataset_name: HiTab/data/train_samples.jsonl
hitab_tables_dir: HiTab/data/tables/raw
eval_dataset_name: HiTab/data/test_samples.jsonl  # held-out set of `--report true`
prompt_template: base
"""),
}
# task -> models -> methods
RECIPES = {
    "math": (["qwen2.5-7b"], list(METHODS)),
    "countdown": (["qwen2.5-3b", "qwen2.5-7b"], ["acpo"]),
    "hitab": (["qwen2.5-3b", "qwen2.5-7b"], ["acpo"]),
}


def _yaml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def batch_fields(regime: str) -> dict[str, int]:
    """per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation of a regime on 8 processes."""
    prompts_per_rollout, prompts_per_update = REGIMES[regime]
    per_device, rest = divmod(PROMPTS_PER_MICRO_STEP * GROUP_SIZE, NUM_PROCESSES)
    assert rest == 0 and prompts_per_update % PROMPTS_PER_MICRO_STEP == 0
    assert prompts_per_rollout % prompts_per_update == 0
    return {
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": prompts_per_update // PROMPTS_PER_MICRO_STEP,
        "steps_per_generation": prompts_per_rollout // PROMPTS_PER_MICRO_STEP,
    }


def render(task: str, model: str, regime: str, method: str) -> str:
    """The YAML text of one recipe."""
    name = f"{model}_{method}_{regime}"
    path = f"configs/{task}/{name}.yaml"
    prompts_per_rollout, prompts_per_update = REGIMES[regime]
    b = batch_fields(regime)
    per_device, accumulation, spg = (b["per_device_train_batch_size"], b["gradient_accumulation_steps"],
                                     b["steps_per_generation"])
    iterations = 2 if method == "ar_lopti" else 1
    updates = spg * iterations // accumulation
    n, micro = NUM_PROCESSES, PROMPTS_PER_MICRO_STEP * GROUP_SIZE
    updates_note = " (ar_lopti: num_iterations = 2, one pass per token group)" if iterations == 2 else ""
    method_lines = "".join(f"{key}: {_yaml(value)}\n" for key, value in method_fields(method).items())
    title, task_lines = TASKS[task]
    note = textwrap.fill(f"{method}: {METHOD_NOTES[method]}.", width=116, initial_indent="# ",
                         subsequent_indent="#   ")
    return f"""\
# {title}, {MODELS[model]} base, {REGIME_TITLES[regime]}, policy loss `{method}`.
{note}
# The ACPO paper's setup ("What are Key Factors for Updates in RL for LLM Reasoning?", arXiv 2606.22570).
# GENERATED by configs/make_recipes.py: change the generator and rerun it, not this file. To compare methods,
# change only `policy_loss` (with the method fields below: the paper's values) and `output_dir`.
#
# Launch on one node of 8 GPUs (docs/recipes.md: other GPU counts, LoRA, vLLM server mode):
#   accelerate launch --config_file configs/accelerate/{ACCELERATE[model]}.yaml examples/train_acpo.py \\
#       --config {path}
#
# Batch arithmetic, paper -> TRL, with {n} processes ({n} GPUs):
#   group size                num_generations = {GROUP_SIZE}
#   completions per update    per_device_train_batch_size x {n} GPUs x gradient_accumulation_steps
#                             = {per_device} x {n} x {accumulation} = {per_device * n * accumulation} \
= {prompts_per_update} prompts per update x {GROUP_SIZE}
#   completions per rollout   per_device_train_batch_size x {n} GPUs x steps_per_generation
#                             = {per_device} x {n} x {spg} = {per_device * n * spg} \
= {prompts_per_rollout} prompts per rollout x {GROUP_SIZE}
#   updates per rollout       steps_per_generation x num_iterations / gradient_accumulation_steps
#                             = {spg} x {iterations} / {accumulation} = {updates}{updates_note}
# On N GPUs keep per_device_train_batch_size x N = {micro} (16 GPUs: --per_device_train_batch_size {micro // 16}).

# Model (ModelConfig)
model_name_or_path: {MODELS[model]}
dtype: float32  # fp32 master weights under bf16 autocast: in bf16 weights, lr-1e-6 updates would round away

# Task (ACPOScriptArguments)
{task_lines}
# Policy loss (ACPOConfig)
{method_lines}
# Objective shared by every method
loss_type: grpo  # token mean within a sequence, then mean over sequences
scale_rewards: group  # GRPO advantages: reward minus group mean, over group std
beta: 0.0  # no KL, no reference model
dual_clip_c: 3.0  # for A < 0 the per-token loss is capped at -3 A (every clipped objective; cispo has none: not here)
mask_truncated_completions: false  # no overlong shaping

# Batch arithmetic (header)
num_generations: {GROUP_SIZE}
per_device_train_batch_size: {per_device}
gradient_accumulation_steps: {accumulation}
steps_per_generation: {spg}

# Optimization
learning_rate: 1.0e-6
lr_scheduler_type: constant
weight_decay: 0.01
max_grad_norm: 1.0
num_train_epochs: 15
bf16: true

# Rollouts: prompts <= 1024 tokens, completions <= 3072, T = 1, top-p 1
max_prompt_length: 1024  # longer training prompts are dropped (a warning says how many)
max_completion_length: 3072
temperature: 1.0
top_p: 1.0
use_vllm: true  # pip install "acpo_trl[vllm]" (TRL 1.16: vLLM 0.22 to 0.31)
vllm_mode: colocate  # vLLM shares the training GPUs
vllm_gpu_memory_utilization: 0.3
vllm_max_model_length: 4096  # 1024 prompt + 3072 completion tokens (vLLM raises on a prompt over 4096)
vllm_importance_sampling_correction: true  # TRL computes old log-probs and corrects vLLM's sampling mismatch
# Server mode instead: vLLM on GPUs of its own (here another machine, so that the 8 training GPUs and the batch
# arithmetic above stay as they are; docs/recipes.md for a split of one node), started first with
#   trl vllm-serve --model {MODELS[model]} --tensor_parallel_size 4 --max_model_len 4096
# and, in this file:
# vllm_mode: server
# vllm_server_host: 10.0.0.2  # EDIT: the server's address
# vllm_server_port: 8000

# Logging and checkpoints
output_dir: outputs/{task}/{name}
logging_steps: 1
save_strategy: steps
save_steps: 100
save_total_limit: 2
report_to: none  # metrics go to the log and output_dir/*/trainer_state.json; or [wandb], [trackio], [tensorboard]
"""


def recipes() -> dict[Path, str]:
    """Every recipe: path -> text."""
    out = {}
    for task, (models, methods) in RECIPES.items():
        for model in models:
            for regime in REGIMES:
                for method in methods:
                    out[CONFIGS / task / f"{model}_{method}_{regime}.yaml"] = render(task, model, regime, method)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report out-of-date recipes instead of writing them")
    args = parser.parse_args(argv)
    stale = {path: text for path, text in recipes().items() if not path.is_file() or path.read_text() != text}
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(CONFIGS.parent)}")
        return 1 if stale else 0
    for path, text in stale.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(CONFIGS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
