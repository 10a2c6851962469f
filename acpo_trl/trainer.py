"""``ACPOTrainer``: TRL's ``GRPOTrainer`` with the loss computed by a policy loss from the registry.

TRL still does generation, rewards, advantages, old/reference log-probs, batching and the optimizer. This class
only replaces the loss: it gathers the micro-batch tensors (calling TRL's ``_get_per_token_logps_and_entropies``),
calls ``get_policy_loss(args.policy_loss)``, applies what TRL's own path applies around the policy term (vLLM
importance-sampling correction, KL to the reference model, MoE aux loss), aggregates with ``loss_type`` and
logs the loss's metrics with one all-reduce per micro-batch.
"""

from __future__ import annotations

import math
import os
import textwrap

import torch
from trl import GRPOTrainer

from .config import ACPOConfig
from .hub import HubUnreachableError, check_hub_reachable
from .losses import PolicyLossInputs, aggregate_loss, get_policy_loss
from .losses.registry import flatten_metrics
from .vllm_check import check_vllm_device

# Model inputs that TRL's batches may carry besides ids and masks (multimodal models), forwarded as they are.
_EXTRA_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class ACPOTrainer(GRPOTrainer):
    """GRPOTrainer whose policy loss is chosen by ``ACPOConfig.policy_loss`` (default: ACPO).

    Takes the same arguments as [`~trl.GRPOTrainer`]; ``args`` must be an [`ACPOConfig`].
    """

    _tag_names = ["trl", "grpo", "acpo"]
    _name = "ACPO"
    _paper = {
        "title": "What are Key Factors for Updates in RL for LLM Reasoning?",
        "id": "2606.22570",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{wang2026acpo,
                title        = {{What are Key Factors for Updates in RL for LLM Reasoning?}},
                author       = {Wang and others},
                year         = 2026,
                eprint       = {arXiv:2606.22570},
            }"""),
    }
    task_name: str | None = None  # set by acpo-train; shown in the model card

    def __init__(self, model, reward_funcs=None, args: ACPOConfig | None = None, *pargs, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = ACPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-ACPO")
        elif not isinstance(args, ACPOConfig):
            raise TypeError(
                f"ACPOTrainer needs `args` to be an ACPOConfig, got {type(args).__name__}. "
                "Build one with ACPOConfig(...) (it accepts every GRPOConfig field)."
            )
        check_vllm_device(args)
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        self.policy_loss_fn = get_policy_loss(args.policy_loss)
        if args.diagnostics or args.diagnostics_grad_every:
            from .diagnostics import DiagnosticsConfig, attach_diagnostics

            attach_diagnostics(
                self,
                DiagnosticsConfig(
                    ratio_stats=args.diagnostics,
                    grad_every=args.diagnostics_grad_every,
                    grad_params=list(args.diagnostics_grad_params),
                ),
            )

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's model card, plus a section stating the method, the paper, the per-bin settings, the regime
        (optimizer updates per rollout) and the task."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            path = os.path.join(self.args.output_dir, "README.md")
            with open(path, "a", encoding="utf-8") as f:
                f.write("\n" + acpo_card_section(self.args, self.task_name or dataset_name))

    def push_to_hub(self, *args, **kwargs):
        """``Trainer.push_to_hub`` after checking that the Hub is reachable; a failed upload names its cause."""
        check_hub_reachable()
        try:
            return super().push_to_hub(*args, **kwargs)
        except Exception as error:  # httpx / HfHubHTTPError / OSError: say what failed and where the model is
            raise HubUnreachableError(
                f"push_to_hub to {self.hub_model_id or self.args.hub_model_id} failed: {error}. The model is saved in "
                f"{self.args.output_dir}."
            ) from error

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.args.policy_loss == "ppl":
            output["logppl_z"] = self._group_logppl_z(output)
        return output

    @torch.no_grad()
    def _group_logppl_z(self, batch) -> torch.Tensor:
        """z-score of each completion's log-perplexity -mean_t log p_old within its prompt group (population std).

        Computed on the whole rollout before TRL shuffles it into micro-batches, gathered over processes like
        TRL's advantages; p_old is the rollout policy (the current model when TRL skipped old log-probs)."""
        mask = batch["completion_mask"]
        old_logps = batch.get("old_per_token_logps")
        if old_logps is None:
            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention_mask = torch.cat([batch["prompt_mask"], mask], dim=1)
            old_logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, batch["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        logppl = -(old_logps * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        groups = self.accelerator.gather(logppl).view(-1, group_size)
        z = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-6)
        start = self.accelerator.process_index * logppl.size(0)
        return z.flatten()[start : start + logppl.size(0)]

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="sum") if self.accelerator.num_processes > 1 else tensor

    def _loss_normalizer(self, inputs, mode: str) -> float | torch.Tensor:
        """What TRL divides the aggregated loss by, so gradient accumulation sums to the batch objective."""
        if self.loss_type == "dapo":
            # `num_items_in_batch` counts the tokens of the whole generation batch on all processes.
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            return normalizer
        return self.current_gradient_accumulation_steps if mode == "train" else 1.0

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _EXTRA_FORWARD_KEYS},
        )
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        old_logps = inputs.get("old_per_token_logps")
        old_logps = logps.detach() if old_logps is None else old_logps

        output = self.policy_loss_fn(
            PolicyLossInputs(
                logps=logps,
                old_logps=old_logps,
                advantages=advantages,
                mask=mask,
                entropies=entropies.detach() if entropies is not None else None,
                logppl_z=inputs.get("logppl_z"),
                update_pass=(self._step // self.args.steps_per_generation) % self.num_iterations,
                all_reduce=self._all_reduce_sum,
            ),
            self.args,
        )
        per_token_loss = output.per_token_loss
        metrics = dict(output.metrics)

        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            ref_logps = inputs["ref_per_token_logps"]
            # k3 estimator of KL(pi_theta || pi_ref), as in TRL.
            per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.exp(logps - old_logps)
            per_token_loss = per_token_loss + self.beta * per_token_kl
            metrics["kl"] = ((per_token_kl * mask).sum().detach(), mask.sum())

        normalizer = self._loss_normalizer(inputs, mode)
        loss = aggregate_loss(
            per_token_loss,
            mask,
            self.loss_type,
            max_completion_length=self.max_completion_length,
            num_items=normalizer if self.loss_type == "dapo" else None,
        )
        one = torch.ones((), device=loss.device)
        metrics["policy_loss"] = (loss.detach(), one)
        if self.loss_type != "dapo":  # dapo's token count already spans the accumulation window
            loss = loss / normalizer
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            metrics["aux_loss"] = (aux_loss.detach(), one)
        metrics["entropy"] = ((entropies.detach() * mask).sum(), mask.sum())
        self._log_metrics(metrics, mode)
        return loss

    def _log_metrics(self, metrics: dict, mode: str) -> None:
        """Reduce every (numerator, denominator) pair over processes in one call and record num / den.

        An empty denominator (e.g. a bin with no token) records NaN, which TRL drops when it averages."""
        names, rows = flatten_metrics(metrics)
        for name, (num, den) in zip(names, self._all_reduce_sum(rows).tolist()):
            self._metrics[mode][name].append(num / den if den > 0 else math.nan)


def acpo_card_section(args: ACPOConfig, task: str | None) -> str:
    """The model card's training-method section for ``args`` (Markdown)."""
    upr = args.updates_per_rollout
    regime = "on-policy (one update per rollout)" if args.is_on_policy else (
        "near on-policy" if upr <= 2 else "off-policy"
    )
    lines = [
        "## ACPO training settings",
        "",
        f"Trained with `acpo_trl`'s ACPOTrainer, policy loss `{args.policy_loss}`. ACPO (arXiv 2606.22570) clips the",
        "importance ratio of each token within a range set per bin of the current token probability:",
        "eps_b = clamp(base + alpha * std_b, min, max), std_b the within-bin std of the ratio.",
        "",
        "| setting | value |",
        "|---|---|",
        f"| policy loss | `{args.policy_loss}` |",
        f"| probability bins K | {args.acpo_num_bins} |",
        f"| alpha / base / clip min / clip max | {args.acpo_alpha} / {args.acpo_base_clip} / {args.acpo_clip_min} / "
        f"{args.acpo_clip_max} |",
        f"| dual-clip c | {args.dual_clip_c} |",
        f"| bin statistics | {args.acpo_stats_scope} |",
        f"| loss aggregation | `{args.loss_type}` |",
        f"| regime | {regime}: {upr:g} optimizer updates per rollout |",
        f"| completions per prompt | {args.num_generations} |",
        f"| learning rate | {args.learning_rate} |",
        f"| task | {task or 'unspecified'} |",
    ]
    return "\n".join(lines) + "\n"
