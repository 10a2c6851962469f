"""The policy-loss registry: one entry per method (modelled on verl's ``core_algos`` registry).

A method is one decorated pure function ``fn(inputs: PolicyLossInputs, config) -> PolicyLossOutput`` and, in the
decorator, everything else the trainer must know about it::

    @register_policy_loss("my_loss", needs={"entropies"}, passes_per_rollout=1, validate=check_my_fields)
    def my_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput: ...

- ``inputs`` holds the micro-batch tensors the trainer gathered (current and old log-probs, advantages,
  completion mask) and, only for a method that declared it in ``needs``, what costs the trainer extra work:
  ``"entropies"`` (per-token entropy), ``"logppl_z"`` (the group z-score of each completion's log-perplexity,
  computed at rollout time), ``"update_pass"`` (which pass over the rollout this is). Shapes are ``(B, T)``.
- ``config`` is the run's :class:`~acpo_trl.ACPOConfig` (any object with the fields the loss reads).
- ``passes_per_rollout``: full update passes over each rollout (TRL's ``num_iterations``; AR-Lopti takes 2).
- ``validate(config)`` checks the method's own config fields when ``ACPOConfig`` is built; it raises
  ``ValueError("ACPOConfig.<field>=<value>: <what is wrong and the fix>")``.
- ``wraps``: the name of a config field that names another registered method this one feeds (the reweightings'
  ``reweight_base_loss``); that method's needs and validation then apply too.
- ``bin_rule``: for a method that clips by probability bins, ``bin_rule(config)`` is its
  :class:`~acpo_trl.losses.BinClipRule` (ACPO's, ``acpo_log``'s, ``bin_clip``'s frozen ranges), so that the
  diagnostics report the method's own ranges.
- ``reads``: the config fields the method reads, TRL's (``epsilon``, ``epsilon_high``, ``delta``,
  ``importance_sampling_level``, ...) and its own. A field some method reads is that method's to set:
  ``ACPOConfig`` refuses a non-default value of it under a method that does not read it, naming the methods that
  do, so that no option is silently ignored.
- ``unset``: the value the method takes for a TRL field that ``GRPOConfig`` leaves unset (None) unless the user sets
  it: ``{"epsilon_high": 0.28}`` for DAPO's clip-higher. Without it an unset ``epsilon_high`` is ``epsilon``, as in
  TRL. :func:`epsilon_high` reads it.
- ``summary``, ``source``: what the method changes and where it comes from, for the README's methods table
  (:func:`acpo_trl.losses.table.methods_table`).
- The output is the per-token loss ``(B, T)``, which the trainer aggregates with ``config.loss_type``; the tokens
  whose gradient the method's trust region removed (``clipped_high``: A > 0 above the range, ``clipped_low``:
  A < 0 below it), which the diagnostics read; and metrics as ``name -> (numerator, denominator)`` pairs of
  tensors, summed over processes in one all-reduce and logged as ``numerator / denominator``. A 0-dim pair is one
  metric; a 1-dim pair of length n is n metrics named ``name.format(i)`` (e.g. ``"acpo/bin{}/eps"``). A method
  emits the same names whatever its data: an undefined value is the pair (0, 0), logged as missing.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

Metric = tuple[torch.Tensor, torch.Tensor]

# What a method may ask the trainer for, beyond the log-probs, advantages and mask every method gets.
NEEDS = frozenset({"entropies", "logppl_z", "update_pass"})


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
        entropies: entropy of the current policy at each position, detached (needs ``"entropies"``).
        logppl_z: ``(B,)`` z-score, within the prompt's group of completions, of each sequence's log-perplexity
            under the rollout policy (-mean_t log p_old) (needs ``"logppl_z"``).
        update_pass: index of the pass over the current rollout (TRL's iteration index, 0-based; needs
            ``"update_pass"``).
        all_reduce: sums a tensor over all training processes (identity in a single process).
    """

    logps: torch.Tensor
    old_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropies: torch.Tensor | None = None
    logppl_z: torch.Tensor | None = None
    update_pass: int | None = None
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = _sum_over_nothing


@dataclass
class PolicyLossOutput:
    """A policy loss's result: ``per_token_loss`` ``(B, T)``, the clip masks (boolean ``(B, T)``, detached; None
    for a method with no trust region) and ``metrics`` (name -> (numerator, denominator))."""

    per_token_loss: torch.Tensor
    metrics: dict[str, Metric] = field(default_factory=dict)
    clipped_high: torch.Tensor | None = None
    clipped_low: torch.Tensor | None = None


PolicyLossFn = Callable[[PolicyLossInputs, object], PolicyLossOutput]


@dataclass(frozen=True)
class PolicyLoss:
    """A registry entry: the loss function and what the trainer must know about the method (see module doc)."""

    name: str
    fn: PolicyLossFn
    needs: frozenset[str] = frozenset()
    passes_per_rollout: int = 1
    validate: Callable[[object], None] | None = None
    wraps: str | None = None
    bin_rule: Callable[[object], object] | None = None
    reads: frozenset[str] = frozenset()
    unset: dict = field(default_factory=dict)
    summary: str = ""
    source: str = ""

    def __call__(self, inputs: PolicyLossInputs, config) -> PolicyLossOutput:
        return self.fn(inputs, config)

    def chain(self, config) -> list["PolicyLoss"]:
        """This entry and the ones it feeds (through ``wraps``), outermost first."""
        chain = [self]
        while chain[-1].wraps is not None:
            chain.append(get_policy_loss(getattr(config, chain[-1].wraps)))
        return chain

    def needs_for(self, config) -> frozenset[str]:
        """What the method, and any method it feeds, needs from the trainer under ``config``."""
        return frozenset().union(*(entry.needs for entry in self.chain(config)))

    def reads_for(self, config) -> frozenset[str]:
        """The config fields the method, and any method it feeds, reads under ``config``."""
        return frozenset().union(*(entry.reads for entry in self.chain(config)))

    def unset_for(self, config) -> dict:
        """The values the method, or the method it feeds, takes for unset TRL fields (where both say, the one fed)."""
        merged = {}
        for entry in self.chain(config):
            merged.update(entry.unset)
        return merged

    def bin_rule_for(self, config):
        """The :class:`~acpo_trl.losses.BinClipRule` the method, or the method it feeds, clips with (None: none)."""
        return next((entry.bin_rule(config) for entry in self.chain(config) if entry.bin_rule), None)

    def validate_config(self, config) -> None:
        """Run the method's own validation, then that of the methods it feeds."""
        for entry in self.chain(config):
            if entry.validate is not None:
                entry.validate(config)


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(
    name: str,
    *,
    needs: frozenset[str] | set[str] | tuple[str, ...] = (),
    passes_per_rollout: int = 1,
    validate: Callable[[object], None] | None = None,
    wraps: str | None = None,
    bin_rule: Callable[[object], object] | None = None,
    reads: frozenset[str] | set[str] | tuple[str, ...] = (),
    unset: dict | None = None,
    summary: str = "",
    source: str = "",
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register ``fn`` under ``name`` so that ``ACPOConfig(policy_loss=name)`` selects it (see the module doc for
    the arguments). The decorated function is returned unchanged."""
    needs = frozenset(needs)
    if needs - NEEDS:
        raise ValueError(f"register_policy_loss({name!r}): unknown needs {sorted(needs - NEEDS)}; choose from "
                         f"{sorted(NEEDS)}.")
    if passes_per_rollout < 1:
        raise ValueError(f"register_policy_loss({name!r}): passes_per_rollout must be >= 1.")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"A policy loss named {name!r} is already registered.")
        POLICY_LOSSES[name] = PolicyLoss(name, fn, needs, passes_per_rollout, validate, wraps, bin_rule,
                                         frozenset(reads) | frozenset(unset or {}), dict(unset or {}), summary, source)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered policy loss ``name``; an unknown name lists the registered ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(
            f"Unknown policy_loss {name!r}. Registered policy losses: {sorted(POLICY_LOSSES)}."
        ) from None


def epsilon_high(config, method: str) -> float:
    """TRL's high clip side under ``method``: ``config.epsilon_high`` when set, else the method's ``unset`` value,
    else ``config.epsilon`` (TRL's rule)."""
    if config.epsilon_high is not None:
        return config.epsilon_high
    return POLICY_LOSSES[method].unset.get("epsilon_high", config.epsilon)


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


def reduce_metrics(
    metrics: dict[str, Metric], all_reduce: Callable[[torch.Tensor], torch.Tensor], num_processes: int = 1
) -> dict[str, float]:
    """Sum every (numerator, denominator) pair over processes in ONE ``all_reduce`` and return name -> num / den
    (NaN, i.e. missing, where the summed denominator is 0).

    Every process must emit the same names in the same order. A 20-bit checksum of the ordered names travels in
    the same reduction as an extra row; a process whose names differ from the others' raises instead of logging
    (or later deadlocking on) mismatched values."""
    names, rows = flatten_metrics(metrics)
    checksum = float(zlib.crc32("\n".join(names).encode()) & 0xFFFFF)  # exact in a float64 sum
    rows = torch.cat([rows, rows.new_tensor([[checksum, 1.0]])])
    *values, (checksum_sum, processes) = all_reduce(rows).tolist()
    if processes != num_processes or checksum_sum != checksum * num_processes:
        raise RuntimeError(
            f"Metric names differ across processes ({len(names)} names here: {names[:6]}...). Every policy loss and "
            "diagnostic must emit the same names whatever its data; log an undefined value as the pair (0, 0)."
        )
    return {name: num / den if den > 0 else math.nan for name, (num, den) in zip(names, values)}
