"""The policy-loss registry and its uniform signature (modelled on verl's ``core_algos`` registry).

Every policy loss is a pure function ``fn(inputs: PolicyLossInputs, config) -> PolicyLossOutput``:

- ``inputs`` holds the micro-batch tensors the trainer gathered (current and old log-probs, advantages,
  completion mask, entropies, ...). Shapes are ``(B, T)`` unless stated otherwise.
- ``config`` is the run's :class:`~acpo_trl.ACPOConfig` (any object with the fields the loss reads).
- The output is the per-token loss ``(B, T)``, which the trainer aggregates with ``config.loss_type``
  (grpo / bnpo / dr_grpo / dapo), and metrics as ``name -> (numerator, denominator)`` pairs of tensors: the
  trainer sums both over processes in one all-reduce and logs ``numerator / denominator``. A 0-dim pair is one
  metric; a 1-dim pair of length n is n metrics named ``name.format(i)`` (e.g. ``"acpo/bin{}/eps"``).

A new method is one decorated function::

    @register_policy_loss("my_loss")
    def my_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

Metric = tuple[torch.Tensor, torch.Tensor]


def _sum_over_nothing(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass
class PolicyLossInputs:
    """The tensors of one micro-batch that a policy loss may read.

    Attributes:
        logps: log pi_theta(y_t) of the sampled tokens under the current policy (carries the gradient).
        old_logps: log pi_old(y_t) under the rollout policy, detached. Equal to ``logps.detach()`` when the
            configuration is on-policy and TRL does not compute old log-probs.
        advantages: ``(B, 1)`` (one per sequence, broadcast) or ``(B, T)``.
        mask: 1.0 for completion tokens that enter the loss, 0.0 for padding (and tool output).
        entropies: entropy of the current policy at each position, detached, or None.
        logppl_z: ``(B,)`` z-score, within the prompt's group of completions, of each sequence's log-perplexity
            under the rollout policy (-mean_t log p_old); computed at rollout time for the losses that read it.
        update_pass: index of the pass over the current rollout (TRL's iteration index, 0-based).
        all_reduce: sums a tensor over all training processes (identity in a single process).
    """

    logps: torch.Tensor
    old_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropies: torch.Tensor | None = None
    logppl_z: torch.Tensor | None = None
    update_pass: int = 0
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = _sum_over_nothing


@dataclass
class PolicyLossOutput:
    """A policy loss's result: ``per_token_loss`` ``(B, T)`` and ``metrics`` (name -> (numerator, denominator))."""

    per_token_loss: torch.Tensor
    metrics: dict[str, Metric] = field(default_factory=dict)


PolicyLossFn = Callable[[PolicyLossInputs, object], PolicyLossOutput]


def flatten_metrics(metrics: dict[str, Metric]) -> tuple[list[str], torch.Tensor]:
    """Expand ``metrics`` into names and one ``(N, 2)`` float64 tensor of (numerator, denominator) rows.

    A 1-dim pair of length n gives the names ``name.format(0) ... name.format(n - 1)``."""
    names, rows = [], []
    for name, (num, den) in metrics.items():
        num = num.detach().double().reshape(-1)
        den = den.detach().double().reshape(-1).expand_as(num)
        names.extend([name] if num.numel() == 1 and "{}" not in name else [name.format(i) for i in range(num.numel())])
        rows.append(torch.stack([num, den], dim=-1))
    return names, torch.cat(rows)
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register ``fn`` under ``name`` so that ``ACPOConfig(policy_loss=name)`` selects it."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"A policy loss named {name!r} is already registered.")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossFn:
    """The registered policy loss ``name``; an unknown name lists the registered ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(
            f"Unknown policy_loss {name!r}. Registered policy losses: {sorted(POLICY_LOSSES)}."
        ) from None
