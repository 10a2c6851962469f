"""The drift guard: stop reusing a rollout once its measured off-policy drift passes a threshold.

PPO implementations stop a rollout's remaining epochs once the approximate KL passes ``target_kl`` (SpinningUp,
Stable-Baselines3); TRL's ``GRPOTrainer`` reuses a rollout ``steps_per_generation x num_iterations`` times whatever
happens. ``ACPOConfig(drift_guard=..., drift_guard_threshold=...)`` measures, before each optimizer update, the drift
of the mini-batch about to be used, on the forward pass the update already makes (its first micro-batch on every
process), with r = exp(clamp(log pi_theta - log pi_old, -20, 20)) over the valid completion tokens:

    ratio_std:  sqrt(E_0[(r - 1)^2] - E_0[r - 1]^2)   E_0: tokens with current probability below 1/K (ACPO's bin 0)
    kl:         E[r - 1 - log r]                       the k3 estimator of KL(pi_old || pi_theta)

Each process sums its tokens' terms (:func:`drift_sums`), one all-reduce sums them over processes, and every rank
takes the same decision (:func:`drift_measure`). When the measure passes the threshold, that update and the
rollout's remaining ones are not applied: the trainer runs no backward pass for them, so no gradient reaches the
optimizer (AdamW skips parameters without one: its moments do not move), and the next rollout is sampled when the
schedule reaches it. A skipped update still counts as a step, so a run of N rollouts samples the same prompts and
completions with or without the guard (``ACPOConfig.num_rollouts`` sets the run length in rollouts).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .losses.acpo import probability_bins
from .losses.common import LOG_RATIO_CLAMP

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


@dataclass
class DriftGuardState:
    """What the guard knows of the run: whether the current rollout was cut, the updates applied in it, the
    rollouts cut short and the updates applied in all, and both measures of the current update (NaN: not
    measured; the guard decides on its own, the other is logged to compare). Saved in every checkpoint."""

    rollout_cut: bool = False
    updates_in_rollout: int = 0
    rollouts_cut: int = 0
    updates_applied: int = 0
    ratio_std: float = math.nan
    kl: float = math.nan

    def start_rollout(self) -> None:
        self.rollout_cut = False
        self.updates_in_rollout = 0

    def begin_update(self) -> None:
        self.ratio_std = self.kl = math.nan

    def record(self, sums: torch.Tensor, measure: str, threshold: float) -> bool:
        """Record both measures of the next update from its summed :func:`drift_sums`; True when ``measure`` passes
        ``threshold`` (the update and the rollout's remaining ones are then not applied). A NaN measure (no token
        to measure) passes nothing."""
        self.ratio_std, self.kl = drift_measure(sums, "ratio_std"), drift_measure(sums, "kl")
        if getattr(self, measure) > threshold:
            self.rollout_cut = True
            self.rollouts_cut += 1
            return True
        self.updates_in_rollout += 1
        self.updates_applied += 1
        return False

    def metrics(self) -> dict[str, float]:
        """The per-step log entries."""
        return {"drift_guard/ratio_std": self.ratio_std, "drift_guard/kl": self.kl,
                "drift_guard/updates_in_rollout": self.updates_in_rollout, "drift_guard/rollouts_cut": self.rollouts_cut,
                "drift_guard/updates_applied": self.updates_applied}

    def to_dict(self) -> dict:
        return asdict(self)


def guard_summary(args, updates_applied: int, rollouts_cut: int, steps: int) -> str:
    """One line on the guard for a report or model card: its rule and how often it acted in ``steps`` steps."""
    if args.drift_guard is None:
        return "off"
    rollouts = math.ceil(steps / args.updates_per_rollout) if steps else 0
    return (f"{args.drift_guard} > {args.drift_guard_threshold:g}: cut {rollouts_cut} of {rollouts} rollouts short, "
            f"{updates_applied} of {steps} updates applied")


class UpdateSkipped(Exception):
    """Raised inside the loss computation when the guard stops an update; the trainer skips its backward pass."""
