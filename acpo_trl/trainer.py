"""``ACPOTrainer``: TRL's ``GRPOTrainer`` with the loss computed by a policy loss from the registry.

TRL still does generation, rewards, advantages, old/reference log-probs, batching and the optimizer. With
``policy_loss="trl"`` the loss is TRL's own too (``GRPOTrainer._compute_loss``). Otherwise this class replaces the
loss, in four steps (``_compute_loss``): the forward pass (TRL's ``_get_per_token_logps_and_entropies``); the
method's loss on the micro-batch tensors, with what its registry entry declared it needs; the terms TRL's own path
applies around the policy term (its off-policy sequence mask and top-entropy mask, the vLLM importance-sampling
correction, KL to the reference model), with TRL's helpers; and the aggregation with ``loss_type`` and
gradient-accumulation normalisation (:func:`~acpo_trl.losses.aggregate_loss`), then TRL's entropy bonus and MoE aux
loss. Metrics are logged with one all-reduce per micro-batch.

With ``drift_guard`` set, the guard (:class:`~acpo_trl.training.drift_guard.DriftGuard`) measures each optimizer update's drift
on the forward pass the update makes and, past its threshold, that update and the rollout's remaining ones are skipped
(``training_step``). A checkpoint keeps TRL's micro-step counter, the rollout being reused and the guard's state, so that a run resumed
mid-rollout goes on with the same rollout and schedule (TRL alone samples a new rollout on resume).
"""

from __future__ import annotations

import logging
import os
import textwrap
from typing import NamedTuple

import torch
from peft import PeftModel
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl import GRPOTrainer

from .config import ACPOConfig
from .diagnostics.hook import DiagnosticsConfig, attach_diagnostics, update_index
from .training.drift_guard import DriftGuard, UpdateSkipped
from .training.report import acpo_card_section, lower_clip_void_message
from .training.host_memory import release_freed_memory
from .utils.hub import HubUnreachableError, check_hub_reachable
from .utils.run_folder import whole_or_removed
from .losses import AggregatedLoss, PolicyLossInputs, aggregate_loss, policy_ratio, reduce_metrics
from .training.shared_prefix import cache_argument, score_with_shared_prefix, shared_prefix_generation
from .utils.vllm_check import check_vllm_device

logger = logging.getLogger(__name__)

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
        self.method = args.method  # None: TRL's own objective
        self.drift_guard = DriftGuard(args, self._all_reduce_sum) if args.drift_guard is not None else None
        self.method_needs = self.method.needs_for(args) if self.method is not None else frozenset()
        self.policy_loss_fn = self.method  # the diagnostics wrap it
        # ACPO's ratio rule can open eps past 1, where its lower clip vanishes: say so once (_say_if_lower_clip_void)
        rule = self.method.bin_rule_for(args) if self.method is not None else None
        self._watch_lower_clip = rule is not None and rule.statistic == "ratio" and rule.eps_max > 1
        self._num_bins = rule.num_bins if rule is not None else args.acpo_num_bins
        if args.share_prompt_prefix:
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:
                raise ValueError("ACPOConfig.share_prompt_prefix=True: not supported under DeepSpeed or FSDP (its "
                                 "two forward calls per micro-batch are untested there); set it to false.")
            base = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
            self._cache_argument = cache_argument(base)
        if args.diagnostics or args.diagnostics_grad_every:
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
                f.write("\n" + acpo_card_section(self.args, self.task_name or dataset_name, self.drift_guard,
                                                  self.state.global_step))

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

    def _generate_single_turn(self, *args, **kwargs):
        """TRL's rollout; with ``share_prompt_prefix`` on the transformers backend, ``generate`` prefills the prefix
        all prompts share once (:func:`~acpo_trl.training.shared_prefix.generate_with_shared_prefix`)."""
        if not self.args.share_prompt_prefix or self.use_vllm or self.use_transformers_continuous_batching:
            return super()._generate_single_turn(*args, **kwargs)
        with shared_prefix_generation(self.accelerator.unwrap_model(self.model_wrapped)):
            return super()._generate_single_turn(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if "logppl_z" in self.method_needs:
            output["logppl_z"] = self._group_logppl_z(output)
        self._release_host_memory()
        return output

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's micro-step, under the drift guard when it is on: in a rollout the guard cut nothing is computed (no
        forward, no backward), and the update it cuts stops after its forward (``UpdateSkipped``, raised in the
        loss before any backward); only TRL's micro-step counter moves on, so the next rollout comes on schedule."""
        guard = self.drift_guard
        try:
            if guard is not None and guard.skips(self._step):
                raise UpdateSkipped
            loss = super().training_step(model, inputs, num_items_in_batch)
        except UpdateSkipped:
            model.train()  # as Trainer.training_step: the step's logs are training logs (TRL reads the mode)
            self._step += 1
            loss = torch.zeros((), device=self.accelerator.device)
        if guard is not None:
            guard.log(self._metrics["train"])
        self._release_host_memory()
        return loss

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; a resumed run first restores the rollout state its checkpoint saved. ``True`` (or
        ``"true"``, as the command line gives it) resumes from the last checkpoint in ``output_dir``, if any."""
        if resume_from_checkpoint is True or resume_from_checkpoint == "true":
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        if isinstance(resume_from_checkpoint, str):
            self._load_rollout_state(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _run_epoch(self, *args, **kwargs):
        """Trainer's pass over the data; none once ``max_steps`` are done. A run resumed from its last step's
        checkpoint (a stop during the final evaluation) would otherwise train one step more: transformers counts the
        steps only at a step's end."""
        if self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _rollout_state_file(self, checkpoint: str) -> str:
        return os.path.join(checkpoint, f"rollout_state_{self.accelerator.process_index}.pt")

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, plus this process's rollout state: TRL's micro-step counter, the rollout being
        reused and the drift guard's state. The rollout state comes first, so that the trainer state, written last,
        marks a whole checkpoint; a checkpoint whose writing fails is removed (no resume starts from part of it)."""
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        state = {"step": self._step, "buffered_inputs": self._buffered_inputs,
                 "drift_guard": self.drift_guard.to_dict() if self.drift_guard is not None else None}
        with whole_or_removed(folder):
            os.makedirs(folder, exist_ok=True)
            torch.save(state, self._rollout_state_file(folder))
            super()._save_checkpoint(model, trial)

    def _load_rollout_state(self, checkpoint: str) -> None:
        path = self._rollout_state_file(checkpoint)
        if not os.path.exists(path):  # a checkpoint of another trainer: TRL's resume (a new rollout)
            logger.warning("%s has no rollout state: the resumed run samples a new rollout.", checkpoint)
            return
        device = self.accelerator.device  # torch.load knows "cpu", not a multi-process CPU run's "cpu:<rank>"
        state = torch.load(path, map_location="cpu" if device.type == "cpu" else device, weights_only=False)
        self._step, self._buffered_inputs = state["step"], state["buffered_inputs"]
        if self.drift_guard is not None and state["drift_guard"] is not None:
            self.drift_guard.load_dict(state["drift_guard"])

    def _release_host_memory(self) -> None:
        """On CPU, return what freed tensors left in the C heap to the OS between phases (:mod:`acpo_trl.training.host_memory`)."""
        if self.accelerator.device.type == "cpu":
            release_freed_memory()

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

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **model_inputs):
        """TRL's per-token log-probs and entropies, with ``share_prompt_prefix`` scored against the prefix the rows
        share (:func:`~acpo_trl.training.shared_prefix.score_with_shared_prefix`; multimodal inputs and the MoE aux loss take
        TRL's path). The drift guard decides on the first forward of the micro-batch whose loss is computed."""
        scored = None
        if self.args.share_prompt_prefix and not compute_aux_loss and all(v is None for v in model_inputs.values()):
            scored = score_with_shared_prefix(model, self.accelerator.unwrap_model(model), input_ids, attention_mask,
                                              logits_to_keep, batch_size, compute_entropy, self._cache_argument,
                                              self.accelerator.autocast)
        output = scored or super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
            **model_inputs)
        if self.drift_guard is not None and self.drift_guard.decide(output[0]):
            raise UpdateSkipped
        return output

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="sum") if self.accelerator.num_processes > 1 else tensor

    def _compute_loss(self, model, inputs):
        if self.drift_guard is not None and self.model.training:
            self.drift_guard.expect(inputs)  # measured on the forward below (_get_per_token_logps_and_entropies)
        if self.method is None:  # policy_loss="trl": TRL's own objective, by TRL's code
            return super()._compute_loss(model, inputs)
        mode = "train" if self.model.training else "eval"
        forward = self._forward(model, inputs)
        output = self.policy_loss_fn(self._policy_loss_inputs(inputs, forward), self.args)
        per_token_loss, metrics = self._with_trl_terms(output.per_token_loss, dict(output.metrics), inputs, forward)
        aggregated = self._aggregate(per_token_loss, forward.mask, inputs, mode)
        loss = aggregated.loss
        one = torch.ones((), device=loss.device)
        metrics["policy_loss"] = (aggregated.value, one)
        if self._entropy_bonus_enabled:
            loss = loss - self._entropy_bonus(forward, mode)
        if self.aux_loss_enabled:  # TRL scales the router's aux loss for accumulation only
            loss = loss + self.router_aux_loss_coef * forward.aux_loss / self._accumulation_steps(mode)
            metrics["aux_loss"] = (forward.aux_loss.detach(), one)
        metrics["entropy"] = ((forward.entropies.detach() * forward.mask).sum(), forward.mask.sum())
        values = self._log_metrics(metrics, mode)
        if mode == "train" and self._watch_lower_clip:
            self._say_if_lower_clip_void(values)
        self._release_host_memory()  # the forward's freed temporaries, before the backward allocates
        return loss

    def _forward(self, model, inputs) -> "_Forward":
        """Step 1: the current policy's per-token log-probs and entropies on the completion (and the aux loss), and
        TRL's top-entropy mask when ``top_entropy_quantile`` < 1."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _EXTRA_FORWARD_KEYS},
        )
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        old_logps = inputs.get("old_per_token_logps")
        old_logps = logps.detach() if old_logps is None else old_logps  # on-policy: TRL skipped old log-probs
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        return _Forward(logps, old_logps, entropies, aux_loss, mask, entropy_mask)

    def _policy_loss_inputs(self, inputs, forward: "_Forward") -> PolicyLossInputs:
        """Step 2: the method's inputs, with what its registry entry declared it needs."""
        advantages = inputs["advantages"]
        needs = self.method_needs
        return PolicyLossInputs(
            logps=forward.logps,
            old_logps=forward.old_logps,
            advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
            mask=forward.mask,
            entropies=forward.entropies.detach() if "entropies" in needs else None,
            logppl_z=inputs["logppl_z"] if "logppl_z" in needs else None,
            update_pass=(self._step // self.args.steps_per_generation) % self.num_iterations
            if "update_pass" in needs else None,
            all_reduce=self._all_reduce_sum,
        )

    def _with_trl_terms(self, per_token_loss, metrics: dict, inputs, forward: "_Forward"):
        """Step 3: what TRL's own path applies around the policy term, in its order and with its helpers: the
        off-policy sequence mask (``off_policy_mask_threshold``), the top-entropy mask (``top_entropy_quantile``),
        the vLLM importance-sampling correction and the KL penalty to the reference model (k3 estimator, optionally
        bias-corrected)."""
        if self.off_policy_mask_threshold is not None:
            advantages = inputs["advantages"]
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
                per_token_logps=forward.logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", forward.old_logps),
                mask=forward.mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if forward.entropy_mask is not None:
            per_token_loss = per_token_loss * forward.entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            ref_logps, logps = inputs["ref_per_token_logps"], forward.logps
            per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
            if self.args.use_bias_correction_kl:  # by TRL's importance weights: per token, or per sequence (GSPO)
                per_token_kl = per_token_kl * policy_ratio(logps, forward.old_logps, forward.mask,
                                                           self.args.importance_sampling_level)
            per_token_loss = per_token_loss + self.beta * per_token_kl
            metrics["kl"] = ((per_token_kl * forward.mask).sum().detach(), forward.mask.sum())
        return per_token_loss, metrics

    def _entropy_bonus(self, forward: "_Forward", mode: str) -> torch.Tensor:
        """TRL's entropy bonus (``entropy_coef``; with ``use_adaptive_entropy`` its controller): coef times the mean
        entropy of the tokens the policy term acts on, scaled for accumulation only. The adaptive coefficient is the
        one set at the end of the previous optimizer step, updated from the step's window-global mean entropy."""
        mask = forward.mask if forward.entropy_mask is None else forward.mask * forward.entropy_mask
        mean_entropy = (forward.entropies * mask).sum() / mask.sum().clamp(min=1.0)
        args = self.args
        coef = self.entropy_coef
        if self.use_adaptive_entropy:
            coef = coef if self._last_world_entropy <= args.entropy_target else 0.0
            if mode == "train":
                stats = torch.stack([(forward.entropies * mask).sum(), mask.sum()]).detach()
                window = self._entropy_window_stats
                self._entropy_window_stats = stats if window is None else window + stats
                if self.accelerator.sync_gradients:
                    total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                    world_entropy = (total[0] / total[1].clamp(min=1.0)).item()
                    if world_entropy <= args.entropy_target:
                        self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
                    else:
                        self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
                    self._last_world_entropy = world_entropy
                    self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return coef * mean_entropy / self._accumulation_steps(mode)

    def _accumulation_steps(self, mode: str) -> int:
        return self.current_gradient_accumulation_steps if mode == "train" else 1  # no accumulation in eval

    def _aggregate(self, per_token_loss, mask, inputs, mode: str) -> AggregatedLoss:
        """Step 4: ``loss_type`` aggregation and TRL's accumulation normalisation (both in ``aggregate_loss``)."""
        return aggregate_loss(
            per_token_loss,
            mask,
            self.loss_type,
            max_completion_length=self.max_completion_length,
            accumulation_steps=self._accumulation_steps(mode),
            rollout_tokens=inputs.get("num_items_in_batch"),
            micro_batches_per_rollout=self.args.steps_per_generation if mode == "train" else 1,
            num_processes=self.accelerator.num_processes,
        )

    def _log_metrics(self, metrics: dict, mode: str) -> dict[str, float]:
        """Reduce every (numerator, denominator) pair over processes in one call and record num / den (NaN, which
        TRL drops when it averages, where the denominator is 0: e.g. a bin with no token); returns them."""
        values = reduce_metrics(metrics, self._all_reduce_sum, self.accelerator.num_processes)
        for name, value in values.items():
            self._metrics[mode][name].append(value)
        return values

    def _say_if_lower_clip_void(self, values: dict[str, float]) -> None:
        """Once per run, the first time ACPO's eps passes 1 in a bin (its lower clip 1 - eps is then below 0 and
        bounds nothing), one log line: which bins, from which update of a rollout, and where to read what it means."""
        bins = [b for b in range(self._num_bins) if values.get(f"acpo/bin{b}/eps", 0.0) > 1.0]
        if not bins:
            return
        self._watch_lower_clip = False
        if not self.accelerator.is_main_process:  # every rank saw the same reduced values: one line per run
            return
        updates = self.args.steps_per_generation * self.num_iterations // self.args.gradient_accumulation_steps
        k = update_index(self._step, self.args.steps_per_generation, self.num_iterations,
                         self.args.gradient_accumulation_steps)
        logger.warning(lower_clip_void_message(bins, [values[f"acpo/bin{b}/eps"] for b in bins], k + 1, updates,
                                               self.state.global_step + 1, self.args.dual_clip_c))


class _Forward(NamedTuple):
    """The forward pass of one micro-batch (``old_logps``: TRL's, or the detached current ones on-policy;
    ``entropy_mask``: TRL's top-entropy mask, or None)."""

    logps: torch.Tensor
    old_logps: torch.Tensor
    entropies: torch.Tensor
    aux_loss: torch.Tensor | None
    mask: torch.Tensor
    entropy_mask: torch.Tensor | None
