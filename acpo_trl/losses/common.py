"""Building blocks shared by the policy losses: the importance ratio (per token, or GSPO's per sequence), the
clipped surrogate with dual-clip, and TRL's clip-ratio metrics."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .registry import Metric

LOG_RATIO_CLAMP = 20.0


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """r = exp(clamp(log pi_theta - log pi_old, -20, 20)): finite even for tokens that moved very far."""
    return torch.exp(torch.clamp(logps - old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def policy_ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str = "token") -> torch.Tensor:
    """TRL's ``importance_sampling_level``: ``"token"``, r_t ``(B, T)`` (:func:`importance_ratio`); ``"sequence"``,
    GSPO's (Zheng et al. 2025, arXiv 2507.18071) s = exp(mean_t (log pi_theta - log pi_old)) over the sequence's
    valid tokens, ``(B, 1)``, as TRL computes it (here with the same +-20 clamp on the log-ratio)."""
    if level == "token":
        return importance_ratio(logps, old_logps)
    mean_log_ratio = ((logps - old_logps) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.exp(torch.clamp(mean_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


class ClippedSurrogate(NamedTuple):
    """Per-token clipped loss and where it clipped: ``clipped_high`` (A > 0, r > high), ``clipped_low``
    (A < 0, r < low); both boolean and detached."""

    loss: torch.Tensor
    clipped_high: torch.Tensor
    clipped_low: torch.Tensor


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    low: torch.Tensor | float,
    high: torch.Tensor | float,
    dual_clip_c: float | None = None,
    ratio_max: float | None = None,
) -> ClippedSurrogate:
    """PPO's clipped surrogate, per token, with optional dual-clip (Ye et al. 2020):

        l = max(-A r', -A clamp(r, low, high)),   r' = min(r, ratio_max) if ratio_max else r
        if A < 0:  l = min(l, -c A)

    ``low = 1 - eps_low`` and ``high = 1 + eps_high`` are floats or per-token tensors (ACPO's bin-wise range).
    ``ratio_max`` is TRL's ``delta`` (a cap on the unclipped ratio, for both advantage signs); the dual-clip
    only bounds negative-advantage tokens, which matters once ``low`` goes below 0 and the low clip vanishes.

    The max picks the clamped (constant) term exactly where the clip binds, A > 0 and r > high or A < 0 and
    r < low, so it is computed as ``-A * where(clipped, bound, r')``: the same value and gradient, a quarter
    cheaper than max/clamp, and the clip masks come for free for the metrics.
    """
    with torch.no_grad():
        detached = ratio.detach()
        clipped_high = (detached > high) & (advantages > 0)
        clipped_low = (detached < low) & (advantages < 0)
        bound = torch.where(advantages > 0, high, low)
    unclipped_ratio = ratio if ratio_max is None else torch.clamp(ratio, max=ratio_max)
    loss = -advantages * torch.where(clipped_high | clipped_low, bound, unclipped_ratio)
    if dual_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip_c * advantages), loss)
    return ClippedSurrogate(loss, clipped_high, clipped_low)


def clip_ratio_metrics(num_low: torch.Tensor, num_high: torch.Tensor, num_tokens: torch.Tensor) -> dict[str, Metric]:
    """TRL's clip-ratio metrics from counts: tokens clipped low (r < low, A < 0), high (r > high, A > 0), either
    (the two are disjoint: they need opposite advantage signs)."""
    return {
        "clip_ratio/low_mean": (num_low, num_tokens),
        "clip_ratio/high_mean": (num_high, num_tokens),
        "clip_ratio/region_mean": (num_low + num_high, num_tokens),
    }
