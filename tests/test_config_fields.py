"""No ACPOConfig field is silently ignored: under every registered method, a field set to a value other than its
default either changes the method's loss on fixed inputs (its value or its gradient), or is refused at construction
naming the field, or is listed below among the fields that do not enter a method's loss. TRL's clip vocabulary
(`epsilon`, `epsilon_high`) means what it means in TRL; the deprecated names still work under the methods that read
them; the README's tables are the registry's."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"

# A value other than the default for every field a method may read (its own, TRL's clip vocabulary, the aggregation,
# the deprecated names). Each one differs from the default enough to move a loss on the inputs below.
WALKED = {
    # TRL's fields a method reads
    "epsilon": 0.35, "epsilon_high": 0.35, "delta": 1.1, "importance_sampling_level": "sequence",
    "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 2.5,
    "vespo_k_pos": 1.0, "vespo_lambda_pos": 1.5, "vespo_k_neg": 1.5, "vespo_lambda_neg": 1.0,
    "loss_type": "bnpo",  # the aggregation, which the walk applies to every method's per-token loss
    # this package's method fields
    "dual_clip_c": None, "acpo_num_bins": 3, "acpo_alpha": 1.0, "acpo_clip_min": 2.9, "acpo_clip_max": 0.3,
    "acpo_stats_scope": "global", "bin_clip_ranges": [0.1, 0.2, 0.3], "dcpo_ratio_cap": 2.0, "cispo_clip_max": 1.1,
    "entropy_token_fraction": 0.5, "ar_weight_c": 0.6, "lopti_prob_threshold": 0.3, "reweight_c": 0.5,
    "reweight_base_loss": "ppo_clip", "ppl_clamp": True,
    # deprecated names (DEPRECATED_FIELDS): under a method that read them they move to TRL's fields, else refused
    "acpo_base_clip": 0.35, "dapo_clip_low": 0.35, "dapo_clip_high": 0.35, "dcpo_clip_low": 0.35,
    "dcpo_clip_high": 0.35, "ar_lopti_clip_low": 0.35, "ar_lopti_clip_high": 0.35, "cispo_mask_low": 0.65,
    "cispo_mask_high": 1.35, "cispo_mask": False,
}

# Fields that TRL's path applies around the policy term, the same way for every method, in the trainer (as TRL
# does: tests/test_trl_equivalence.py proves each equal to GRPOTrainer's): KL to the reference, the entropy bonus and
# its controller, TRL's masks, vLLM's importance-sampling correction, the MoE aux loss, and the temperature and
# precision of the forward pass that computes the log-probs.
TRAINER_TERMS = {
    "beta", "use_bias_correction_kl", "entropy_coef", "entropy_coef_delta", "entropy_coef_max", "entropy_coef_min",
    "entropy_target", "use_adaptive_entropy", "top_entropy_quantile", "off_policy_mask_threshold",
    "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_cap",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max", "router_aux_loss_coef", "temperature",
    "cast_lm_head_to_fp32", "max_completion_length",  # also dr_grpo's normaliser, applied with the aggregation
}

# Fields that do not enter a policy loss: what is sampled and how it is scored (generation, rewards, advantages), when
# updates happen (the schedule, the drift guard), the reference model's upkeep, what is logged (the diagnostics), and
# the infrastructure (vLLM, batching of generation, prefix sharing). Besides these, TrainingArguments' own fields (the
# Trainer's data loading, optimizer, schedule, precision, logging, saving and hardware) are not a method's.
NOT_LOSS = {
    # the rollout: generation and scoring
    "num_generations", "num_generations_eval", "generation_batch_size", "generation_kwargs", "top_p", "top_k",
    "min_p", "repetition_penalty", "cache_implementation", "chat_template_kwargs", "max_tool_calling_iterations",
    "mask_truncated_completions", "scale_rewards", "reward_weights", "multi_objective_aggregation",
    "use_transformers_paged", "use_transformers_continuous_batching", "transformers_continuous_batching_config",
    "pad_to_multiple_of", "shuffle_dataset", "disable_dropout", "model_init_kwargs", "trust_remote_code",
    # vLLM as the generator
    "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization",
    "vllm_group_port", "vllm_max_model_length", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
    "vllm_server_timeout", "vllm_structured_outputs_regex", "vllm_tensor_parallel_size", "ds3_gather_for_generation",
    # the schedule of updates
    "num_iterations", "steps_per_generation", "num_rollouts", "drift_guard", "drift_guard_threshold",
    "drift_guard_min_tokens", "drift_guard_fallback_threshold",
    # the reference model's upkeep
    "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps",
    # what is logged
    "log_completions", "log_completions_hub_repo", "log_multimodal", "log_unique_prompts", "num_completions_to_print",
    "diagnostics", "diagnostics_grad_every", "diagnostics_grad_params", "diagnostics_num_bins",
    # the forward pass's cost, not its result (up to rounding)
    "share_prompt_prefix",
    # the method itself: the walk's outer loop
    "policy_loss",
}

# What a method needs to be built at all (bin_clip has no default ranges).
BASE = {"bin_clip": {"bin_clip_ranges": [0.3] * 5}}


def fixed_inputs() -> list:
    """Two batches of 8 sequences x 10 tokens, probabilities over every bin, advantages of both signs, padding,
    log-perplexity z-scores, and a second process for the global statistics (its per-bin sums this process's shifted
    by one bin). "Wide": log-ratios N(0, 0.25) with outliers of +1.4 at position 2 (the row's highest entropy)
    and +-1.4 at position 7 (its lowest), so that every fixed clip and the dual clip bind. "Narrow": log-ratios
    N(0, 0.1) with one outlier of +1.5 per probability bin, so that ACPO's ranges stay narrow enough to bind (and
    acpo_log's, in log space)."""
    from acpo_trl.losses import PolicyLossInputs

    g = torch.Generator().manual_seed(0)
    advantages = torch.tensor([[1.5], [-1.2], [0.7], [-0.4], [2.0], [-2.0], [0.3], [-0.9]])
    mask = torch.ones(8, 10)
    mask[1, 8:] = mask[4, 9:] = 0
    batches = []
    for wide in (True, False):
        probs = torch.rand(8, 10, generator=g) * 0.96 + 0.02
        log_ratio = (0.25 if wide else 0.1) * torch.randn(8, 10, generator=g)
        entropies = 0.5 + torch.rand(8, 10, generator=g)
        if wide:
            log_ratio[:, 2] += 1.4
            log_ratio[:, 4] = math.log(1.32)  # above 1.3, below 1.35
            log_ratio[:, 5] = -0.3  # r = 0.74: below 0.8, above 0.65
            log_ratio[:, 7] -= 1.4 * advantages[:, 0].sign()  # A < 0: r ~ 4, past the dual clip; A > 0: r ~ 0.25
            entropies[:, 2], entropies[:, 5], entropies[:, 7] = 3.0, 2.5, 0.1
        else:
            probs[:5, 2] = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9])
            log_ratio[:5, 2] += 1.5
        logps = probs.log().requires_grad_(True)
        batches.append(PolicyLossInputs(logps, logps.detach() - log_ratio, advantages, mask, entropies=entropies,
                                        logppl_z=torch.tensor([2.5, -2.5, 1.5, -1.5, 0.5, -0.5, 3.0, -3.0]),
                                        update_pass=0, all_reduce=lambda t: t + t.roll(1, -1)))
    return batches


def loss_and_grad(config, inputs):
    from acpo_trl.losses import aggregate_loss

    out = config.method(inputs, config)
    loss = aggregate_loss(out.per_token_loss, inputs.mask, config.loss_type,
                          max_completion_length=config.max_completion_length).loss
    (grad,) = torch.autograd.grad(loss, inputs.logps)
    return loss.detach(), grad


def make(tmp_path, method, **overrides):
    from acpo_trl import ACPOConfig

    return ACPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_completion_length=10,
                      policy_loss=method, **{**BASE.get(method, {}), **overrides})


def ignored_fields(tmp_path) -> list[str]:
    """``field (method)`` for every walked field that, set under a method, neither changes its loss nor is refused."""
    from acpo_trl.losses import POLICY_LOSSES

    batches = fixed_inputs()
    ignored = []
    for method in sorted(POLICY_LOSSES):
        base = [loss_and_grad(make(tmp_path, method), inputs) for inputs in batches]
        for name, value in WALKED.items():
            try:
                config = make(tmp_path, method, **{name: value})
            except ValueError as error:
                assert re.search(r"ACPOConfig\.\w+=", str(error)), str(error)  # names the field
                continue
            if all(torch.equal(a, b) for inputs, before in zip(batches, base)
                   for a, b in zip(loss_and_grad(config, inputs), before)):
                ignored.append(f"{name} ({method})")
    return ignored


def test_every_field_changes_the_loss_or_is_refused_or_listed(tmp_path, caplog):
    from transformers import TrainingArguments

    from acpo_trl import ACPOConfig
    from acpo_trl.losses import POLICY_LOSSES

    trainer_fields = {spec.name for spec in fields(TrainingArguments)}
    every = {spec.name for spec in fields(ACPOConfig)}
    own = every - trainer_fields | {"loss_type"}  # GRPOConfig's and ACPOConfig's (ACPOConfig redefines loss_type)
    classified = set(WALKED) | TRAINER_TERMS | NOT_LOSS
    assert own - classified == set(), "classify these fields in this file"
    assert classified - own == set(), "no longer ACPOConfig fields"
    assert not (set(WALKED) & TRAINER_TERMS or set(WALKED) & NOT_LOSS or TRAINER_TERMS & NOT_LOSS)
    read = frozenset().union(*(entry.reads for entry in POLICY_LOSSES.values()))
    assert read <= set(WALKED), "a field some method reads is walked"
    with caplog.at_level(logging.ERROR):  # the deprecation warnings, once per field and method, are not the point
        assert ignored_fields(tmp_path) == []


def test_the_inputs_exercise_every_clip(tmp_path):
    """The walk is not vacuous: on its inputs every clipped method clips on both sides and the dual clip binds."""
    from acpo_trl.losses import POLICY_LOSSES

    batches = fixed_inputs()
    for method in ("ppo_clip", "dapo", "acpo", "acpo_log", "dcpo", "bin_clip", "masked_cispo"):
        outs = [POLICY_LOSSES[method](inputs, make(tmp_path, method)) for inputs in batches]
        assert any(out.clipped_high.any() for out in outs) and any(out.clipped_low.any() for out in outs), method
    wide = batches[0]
    ratio = (wide.logps.detach() - wide.old_logps).exp()
    assert ((ratio > 3) & (wide.advantages < 0) & wide.mask.bool()).any()  # beyond the dual clip c = 3


def test_epsilon_high_means_trls_under_every_clip(tmp_path):
    """What a TRL user who writes `policy_loss: dapo, epsilon_high: 0.28` gets: DAPO's clip-higher [0.8, 1.28], the
    same as TRL's GRPO clip with those fields; unset, DAPO keeps the paper's 0.28 and ppo_clip TRL's epsilon."""
    inputs = fixed_inputs()[0]
    dapo = make(tmp_path, "dapo", epsilon_high=0.28)
    ppo = make(tmp_path, "ppo_clip", epsilon_high=0.28)
    assert torch.equal(loss_and_grad(dapo, inputs)[0], loss_and_grad(ppo, inputs)[0])
    assert torch.equal(loss_and_grad(make(tmp_path, "dapo"), inputs)[0], loss_and_grad(dapo, inputs)[0])
    assert not torch.equal(loss_and_grad(make(tmp_path, "ppo_clip"), inputs)[0], loss_and_grad(ppo, inputs)[0])


@pytest.mark.parametrize("old,value,method,new,expected", [
    ("dapo_clip_high", 0.3, "dapo", "epsilon_high", 0.3),
    ("acpo_base_clip", 0.25, "acpo", "epsilon", 0.25),
    ("dcpo_clip_low", 0.16, "dcpo", "epsilon", 0.16),
    ("cispo_mask_low", 0.8, "cispo", "epsilon", 0.2),
    ("cispo_mask_high", 1.3, "cispo", "epsilon_high", 0.3),
    ("ar_lopti_clip_high", 0.24, "ar_lopti", "epsilon_high", 0.24),
])
def test_deprecated_names_work_for_one_release_with_a_warning(tmp_path, caplog, old, value, method, new, expected):
    with caplog.at_level(logging.WARNING, logger="acpo_trl.config"):
        config = make(tmp_path, method, **{old: value})
    assert getattr(config, new) == expected and getattr(config, old) is None
    assert f"{old} is deprecated: it is now {new}" in caplog.text
    with pytest.raises(ValueError, match=f"ACPOConfig.{old}=.*does not read it"):
        make(tmp_path, "sapo", **{old: value})


def test_the_readme_tables_are_the_registrys():
    """The methods table and the table of TRL's fields per method are generated from the registry."""
    from types import SimpleNamespace

    from acpo_trl.config import _defaults
    from acpo_trl.losses.table import methods_table, trl_fields_table

    text = README.read_text()
    defaults = SimpleNamespace(**_defaults())
    for table in (methods_table(defaults), trl_fields_table(defaults)):
        assert table in text, f"README.md: replace the table with\n{table}"


def test_trls_mirrors_are_told_apart_from_the_authors_cispo(tmp_path):
    """`cispo` is deprecated for `masked_cispo`; TRL's CISPO is `trl_cispo`, which caps at epsilon_high."""
    config = make(tmp_path, "cispo")
    assert config.policy_loss == "masked_cispo" and math.isclose(config.cispo_clip_max, 1.45)
    assert make(tmp_path, "trl_cispo", epsilon_high=5.0).epsilon_high == 5.0
    with pytest.raises(ValueError, match="ACPOConfig.cispo_clip_max=2.0: policy_loss='trl_cispo' does not read it"):
        make(tmp_path, "trl_cispo", cispo_clip_max=2.0)
