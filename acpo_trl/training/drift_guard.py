"""The drift guard: stop reusing a rollout once its measured off-policy drift passes a threshold.

PPO implementations stop a rollout's remaining epochs once the approximate KL passes ``target_kl`` (SpinningUp,
Stable-Baselines3); TRL's ``GRPOTrainer`` reuses a rollout ``steps_per_generation x num_iterations`` times whatever
happens. ``ACPOConfig(drift_guard=..., drift_guard_threshold=...)`` measures, before each optimizer update, the drift
of the mini-batch about to be used, on the forward pass the update already makes (its first micro-batch on every
process), with r = exp(clamp(log pi_theta - log pi_old, -20, 20)) over the valid completion tokens:

    ratio_std:  sqrt(E_0[(r - 1)^2] - E_0[r - 1]^2)   E_0: tokens with current probability below 1/K (ACPO's bin 0)
    kl:         E[r - 1 - log r]                       the k3 estimator of KL(pi_old || pi_theta)

**The token rule.** A decision rests on at least ``drift_guard_min_tokens`` tokens (default 16: the std of a
sample std is ~sigma / sqrt(2n), so at n = 16 a drift of two thirds of the threshold reads past it in ~0.3% of
updates under a normal model, at n = 2 in ~25%). ``ratio_std`` with fewer bin-0 tokens decides on k3 over all the
mini-batch's tokens against ``drift_guard_fallback_threshold`` (default :data:`KL_THRESHOLD`); a measure with fewer
tokens than the minimum even so applies the update (no decision). Each decision logs the tokens it rested on.

Each process sums its tokens' terms (:func:`drift_sums`), one all-reduce sums them over processes, and every rank
takes the same decision (:meth:`DriftGuard.decide`). When the measure passes its threshold, that update and the
rollout's remaining ones are not applied: the trainer runs no backward pass for them, so no gradient reaches the
optimizer (AdamW skips parameters without one: its moments do not move), and the next rollout is sampled when the
schedule reaches it. A skipped update still counts as a step, so a run of N rollouts samples the same prompts and
completions with or without the guard (``ACPOConfig.num_rollouts`` sets the run length in rollouts).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from ..losses.acpo import probability_bins
from ..losses.common import LOG_RATIO_CLAMP

# The fewest tokens a decision rests on (the module docstring says why 16).
MIN_TOKENS = 16
# k3 at the drift the ratio_std guard's 0.3 stands for: the median, over the committed unguarded SmolLM2 runs of the
# addition at 16 updates per rollout whose run-mean bin-0 ratio std reaches 0.3 at some update index k (32 of 80:
# level a's, and one of level b's), of their k3 at the first such k (0.070; `acpo-study report`, table.md "The drift
# guard"; acpo_trl/study/drift.py::k3_at_ratio_std). Chosen from committed runs before any run with the token rule.
KL_THRESHOLD = 0.07
# How a decision was taken (logged as drift_guard/decided_by): on the guard's own measure, on the k3 fallback, or
# not at all (too few tokens for either: the update is applied).
OWN, FALLBACK, UNDECIDED = 0, 1, 2

# Layout of drift_sums: bin-0 token count, sum of r - 1 and of (r - 1)^2 over bin 0; token count, sum of k3.
_BIN0_COUNT, _BIN0_SUM, _BIN0_SQ, _COUNT, _K3 = range(5)


@torch.no_grad()
def drift_sums(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, num_bins: int) -> torch.Tensor:
    """This process's terms of both measures, float64 ``(5,)``: bin-0 count, sum of r - 1, sum of (r - 1)^2 (bin 0:
    current probability below 1 / ``num_bins``), token count, sum of r - 1 - log r. Sums, so that adding them over
    processes (and micro-batches) gives the measures of the whole mini-batch."""
    log_ratio = torch.clamp(logps.detach().double() - old_logps.double(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    valid = mask.double()
    deviation = log_ratio.exp() - 1  # r - 1: 0 on-policy, so float sums stay accurate
    in_bin0 = (probability_bins(logps, num_bins) == 0).double() * valid
    k3 = deviation - log_ratio
    return torch.stack([in_bin0.sum(), (deviation * in_bin0).sum(), (deviation.square() * in_bin0).sum(), valid.sum(),
                        (k3 * valid).sum()])


def drift_measure(sums: torch.Tensor, measure: str) -> float:
    """The measure (``"ratio_std"`` or ``"kl"``) from summed :func:`drift_sums`; NaN when it has no token."""
    values = sums.tolist()
    if measure == "kl":
        return values[_K3] / values[_COUNT] if values[_COUNT] > 0 else math.nan
    count = values[_BIN0_COUNT]
    if count == 0:
        return math.nan
    mean = values[_BIN0_SUM] / count
    return math.sqrt(max(values[_BIN0_SQ] / count - mean * mean, 0.0))


def measure_tokens(sums: torch.Tensor, measure: str) -> int:
    """The tokens ``measure`` rests on in summed :func:`drift_sums`: bin 0's for ratio_std, all valid ones for kl."""
    return int(sums[_COUNT if measure == "kl" else _BIN0_COUNT].item())


@dataclass
class DriftGuardState:
    """What the guard knows of the run, saved in every checkpoint: whether the current rollout was cut, the updates
    applied in it, the rollouts cut short and the updates applied in all, and the current update's measures (NaN:
    not measured), the tokens each rested on and how the decision was taken (``OWN``, ``FALLBACK``,
    ``UNDECIDED``; NaN: no decision), and how many decisions were taken each way."""

    rollout_cut: bool = False
    updates_in_rollout: int = 0
    rollouts_cut: int = 0
    updates_applied: int = 0
    decisions: tuple[int, int, int] = (0, 0, 0)  # taken OWN, FALLBACK, UNDECIDED, in all
    ratio_std: float = math.nan
    kl: float = math.nan
    bin0_tokens: float = math.nan
    tokens: float = math.nan
    decided_by: float = math.nan


class DriftGuard:
    """The guard of one trainer: its rule (from ``ACPOConfig``), its state, its decision and its log.

    The trainer tells it where it is and what it computes: :meth:`skips` at the start of each training micro-step
    (True: the rollout was cut, run nothing), :meth:`expect` with the micro-batch whose loss is computed next, and
    :meth:`decide` with the current log-probs of that micro-batch's forward (True: cut the rollout before the
    update's backward pass). Only an update's first micro-batch is measured. ``all_reduce`` sums a tensor over
    processes."""

    def __init__(self, args, all_reduce: Callable[[torch.Tensor], torch.Tensor]):
        self.measure = args.drift_guard
        self.threshold = args.drift_guard_threshold
        self.min_tokens = args.drift_guard_min_tokens
        self.fallback_threshold = (KL_THRESHOLD if args.drift_guard_fallback_threshold is None
                                   else args.drift_guard_fallback_threshold)
        self.num_bins = args.acpo_num_bins
        self.micro_steps_per_rollout = args.steps_per_generation * args.num_iterations
        self.micro_steps_per_update = args.gradient_accumulation_steps
        self.all_reduce = all_reduce
        self.state = DriftGuardState()
        self._first_of_update = False  # the current micro-step opens an optimizer update
        self._expected = None  # (old log-probs, mask) of the micro-batch to measure

    @property
    def updates_applied(self) -> int:
        return self.state.updates_applied

    @property
    def rollouts_cut(self) -> int:
        return self.state.rollouts_cut

    def skips(self, micro_step: int) -> bool:
        """At the start of training micro-step ``micro_step`` (TRL's counter): a new rollout resets the rollout's
        counts, an update's first micro-step will be measured; True when the rollout was cut."""
        state = self.state
        if micro_step % self.micro_steps_per_rollout == 0:
            state.rollout_cut, state.updates_in_rollout = False, 0
        self._first_of_update = micro_step % self.micro_steps_per_update == 0
        self._expected = None
        if self._first_of_update:
            state.ratio_std = state.kl = state.bin0_tokens = state.tokens = state.decided_by = math.nan
        return state.rollout_cut

    def expect(self, inputs: dict) -> None:
        """The micro-batch whose loss is computed next (TRL's inputs): measured by :meth:`decide` when it is an
        update's first and not yet measured."""
        if self._first_of_update and math.isnan(self.state.decided_by):
            mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
            self._expected = (inputs.get("old_per_token_logps"), mask)

    def decide(self, logps: torch.Tensor) -> bool:
        """On the current log-probs of :meth:`expect`'s micro-batch: both measures summed over processes, the
        decision by the token rule; True when the update and the rollout's remaining ones are cut (counted here).
        Any other call returns False."""
        if self._expected is None:
            return False
        (old_logps, mask), self._expected = self._expected, None
        old_logps = logps.detach() if old_logps is None else old_logps  # on-policy: TRL skipped old log-probs
        sums = self.all_reduce(drift_sums(logps, old_logps, mask, self.num_bins))
        state = self.state
        state.ratio_std, state.kl = drift_measure(sums, "ratio_std"), drift_measure(sums, "kl")
        state.bin0_tokens, state.tokens = measure_tokens(sums, "ratio_std"), measure_tokens(sums, "kl")
        if measure_tokens(sums, self.measure) >= self.min_tokens:
            state.decided_by, cut = OWN, getattr(state, self.measure) > self.threshold
        elif self.measure == "ratio_std" and state.tokens >= self.min_tokens:
            state.decided_by, cut = FALLBACK, state.kl > self.fallback_threshold
        else:
            state.decided_by, cut = UNDECIDED, False
        state.decisions = tuple(n + (way == state.decided_by) for way, n in enumerate(state.decisions))
        if cut:
            state.rollout_cut = True
            state.rollouts_cut += 1
        else:
            state.updates_in_rollout += 1
            state.updates_applied += 1
        return cut

    def log(self, metrics: dict[str, list]) -> None:
        """Append :meth:`metrics` to the trainer's ``metrics`` lists once per update (at its first micro-step)."""
        if self._first_of_update:
            for name, value in self.metrics().items():
                metrics[name].append(value)

    def metrics(self) -> dict[str, float]:
        """The per-update log entries (NaN where not measured, which TRL drops)."""
        state = self.state
        return {"drift_guard/ratio_std": state.ratio_std, "drift_guard/kl": state.kl,
                "drift_guard/bin0_tokens": state.bin0_tokens, "drift_guard/tokens": state.tokens,
                "drift_guard/decided_by": state.decided_by,
                "drift_guard/updates_in_rollout": state.updates_in_rollout,
                "drift_guard/rollouts_cut": state.rollouts_cut, "drift_guard/updates_applied": state.updates_applied}

    def to_dict(self) -> dict:
        """The state, for a checkpoint."""
        return asdict(self.state)

    def load_dict(self, state: dict) -> None:
        """Restore :meth:`to_dict`'s state (a checkpoint of an earlier version lacks the newer fields)."""
        self.state = DriftGuardState(**{**asdict(DriftGuardState()), **state})
        self.state.decisions = tuple(self.state.decisions)


class UpdateSkipped(Exception):
    """Raised inside the loss computation when the guard cuts an update; the trainer skips its backward pass."""
