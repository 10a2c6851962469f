"""Switching the diagnostics on for an ``ACPOTrainer`` (any policy loss) without changing its loss.

``attach_diagnostics(trainer, DiagnosticsConfig(...))`` wraps ``trainer.policy_loss_fn``: after the method's own
loss it adds, to the metrics the trainer already all-reduces and logs in one call,

- every micro-batch: :func:`~acpo_trl.diagnostics.ratio_diagnostics` keyed by the update index k within the
  rollout (``diag/k{k}/bin{b}/...``), with the clip masks the method's loss returned and the bin rule of
  :func:`diagnostics_rule` (``acpo_eps``: the method's own ranges for ACPO, ``acpo_log`` and ``bin_clip``, what ACPO
  would set for the others), which ``diag/eps_rule_logratio`` (1: the log-ratio rule of ``acpo_log``, 0: the
  ratio) and ``diag/eps_rule_own`` (1: the method's own rule, 0: ACPO's, not applied) record;
- once in every window of ``grad_every`` optimizer steps (at a rotating update index, see
  :func:`gradient_step_due`), on the first micro-batch of the step:
  :func:`~acpo_trl.diagnostics.gradient_diagnostics` on the parameters matching ``grad_params``; the angle, the norm
  ratio and the gradient shares are also logged per k (``grad/k{k}/angle_deg``, ``grad/k{k}/norm_ratio``,
  ``grad/k{k}/share/bin{b}/{pos,neg}``: which token group dominates early or late in a rollout). Under DeepSpeed (any ZeRO stage)
  they run inside :func:`~acpo_trl.diagnostics.gradients.outside_engine_backward`, which keeps their extra backward
  passes out of the engine's own backward and, under ZeRO-3, gathers the partitioned weights for them.

k = (micro-step within the rollout cycle) // gradient_accumulation_steps, the micro-step being TRL's
``_step % (steps_per_generation * num_iterations)``: 0 is the first optimizer update after a rollout (r == 1).
The wrapper sees the method's per-token loss before the trainer adds KL / the vLLM importance correction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..losses.acpo import PAPER_BASE, BinClipRule
from ..losses.registry import PolicyLossInputs, PolicyLossOutput
from .gradients import gradient_diagnostics, outside_engine_backward, select_parameters
from .ratio_stats import ratio_diagnostics


@dataclass
class DiagnosticsConfig:
    """Options of :func:`attach_diagnostics`.

    ratio_stats: per-k, per-bin ratio statistics every micro-batch (cheap: leave on).
    grad_every: gradient diagnostics every N optimizer steps (0: off).
    grad_params: regular expressions selecting the parameters of the gradient diagnostics (empty: all).
    grad_per_group: also the per-bin, per-sign gradient shares (2K more backward passes).
    """

    ratio_stats: bool = True
    grad_every: int = 0
    grad_params: list[str] = field(default_factory=list)
    grad_per_group: bool = True


def update_index(step: int, steps_per_generation: int, num_iterations: int, gradient_accumulation_steps: int) -> int:
    """k: the optimizer update index within the current rollout for TRL micro-step counter ``step``."""
    return (step % (steps_per_generation * num_iterations)) // gradient_accumulation_steps


def gradient_step_due(optimizer_step: int, grad_every: int, updates_per_rollout: int) -> bool:
    """Whether the gradient diagnostics run at ``optimizer_step``: once in every window of ``grad_every`` steps, at
    an offset that rotates with the window, so that successive diagnoses fall on different update indices k (a
    fixed offset would always hit the same k, e.g. k = 0, where r == 1 and nothing is clipped)."""
    window, offset = divmod(optimizer_step, grad_every)
    return offset == window % min(updates_per_rollout, grad_every)


def diagnostics_rule(run_config) -> tuple[BinClipRule, bool]:
    """(the bin rule whose bins and ranges the diagnostics report, whether it is the method's own). The method's own
    when it clips by bins (ACPO: the ratio's std; ``acpo_log``: the log-ratio's; ``bin_clip``: its frozen ranges)
    and ``diagnostics_num_bins`` is unset or its K; else ACPO's ratio rule with the config's ``acpo_*`` fields and
    the paper's base 0.2 (whatever the method's own ``epsilon``, so that every method is measured against the same
    rule), at ``diagnostics_num_bins`` bins when set (e.g. 5 bins for a 1-bin ACPO, to compare its clipping per bin)."""
    own = run_config.method.bin_rule_for(run_config) if run_config.method is not None else None
    num_bins = getattr(run_config, "diagnostics_num_bins", None)
    if own is not None and num_bins in (None, own.num_bins):
        return own, True
    acpo = BinClipRule.from_config(run_config, base=PAPER_BASE if own is None else None)
    return (acpo if num_bins is None else replace(acpo, num_bins=num_bins)), False


def attach_diagnostics(trainer, config: DiagnosticsConfig):
    """Wrap ``trainer.policy_loss_fn`` so that it also returns the diagnostics; returns the trainer."""
    loss_fn = trainer.policy_loss_fn
    args = trainer.args
    params = [p for _, p in select_parameters(trainer.model, config.grad_params)] if config.grad_every else []

    updates = max(1, args.steps_per_generation * trainer.num_iterations // args.gradient_accumulation_steps)
    rule, own_rule = diagnostics_rule(args)

    def with_diagnostics(inputs: PolicyLossInputs, run_config) -> PolicyLossOutput:
        output = loss_fn(inputs, run_config)
        if not trainer.model.training:
            return output
        metrics = dict(output.metrics)
        step = trainer._step
        ga = args.gradient_accumulation_steps
        k = update_index(step, args.steps_per_generation, trainer.num_iterations, ga)
        if config.ratio_stats:
            metrics.update(ratio_diagnostics(
                inputs.logps, inputs.old_logps, inputs.mask, inputs.advantages, rule=rule,
                clipped_high=output.clipped_high, clipped_low=output.clipped_low, k=k,
            ))
            one = inputs.logps.new_ones((), dtype=torch.float64)
            metrics["diag/eps_rule_logratio"] = (one * (rule.statistic == "logratio"), one)
            metrics["diag/eps_rule_own"] = (one * own_rule, one)
        if config.grad_every and step % ga == 0 and gradient_step_due(step // ga, config.grad_every, updates):
            with outside_engine_backward(trainer.model_wrapped):  # DeepSpeed; else nothing
                grad = gradient_diagnostics(
                    output.per_token_loss, inputs.logps, inputs.old_logps, inputs.advantages, inputs.mask, params,
                    loss_type=run_config.loss_type, num_bins=rule.num_bins,
                    max_completion_length=run_config.max_completion_length, per_group=config.grad_per_group,
                )
            for name in [n for n in grad if n.startswith("grad/share/")] + ["grad/angle_deg", "grad/norm_ratio"]:
                grad[f"grad/k{k}/{name[5:]}"] = grad[name]
            metrics.update(grad)
        return replace(output, metrics=metrics)

    trainer.policy_loss_fn = with_diagnostics
    return trainer
