"""Building blocks shared by the policy losses: the importance ratio, the clipped surrogate with
dual-clip, and masked metric helpers."""

from __future__ import annotations

import torch

from .registry import Metric

LOG_RATIO_CLAMP = 20.0


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """r = exp(clamp(log pi_theta - log pi_old, -20, 20)): finite even for tokens that moved very far."""
    return torch.exp(torch.clamp(logps - old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: torch.Tensor | float,
    eps_high: torch.Tensor | float,
    dual_clip_c: float | None = None,
    ratio_max: float | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate, per token, with optional dual-clip (Ye et al. 2020):

        l = max(-A r', -A clamp(r, 1 - eps_low, 1 + eps_high)),   r' = min(r, ratio_max) if ratio_max else r
        if A < 0:  l = min(l, -c A)

    ``eps_low`` / ``eps_high`` are floats or per-token tensors (ACPO's bin-wise range). ``ratio_max`` is TRL's
    ``delta`` (a cap on the unclipped ratio, for both advantage signs); the dual-clip only bounds
    negative-advantage tokens, which matters once ``1 - eps`` goes below 0 and the low clip vanishes.
    """
    unclipped_ratio = ratio if ratio_max is None else torch.clamp(ratio, max=ratio_max)
    loss = torch.maximum(-advantages * unclipped_ratio, -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    if dual_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip_c * advantages), loss)
    return loss


def masked_metric(values: torch.Tensor, mask: torch.Tensor) -> Metric:
    """(sum of ``values`` over masked-in tokens, number of masked-in tokens): a mean once reduced."""
    values = values.expand_as(mask)
    return (values * mask).sum().detach(), mask.sum().detach()


def clip_fraction_metrics(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: torch.Tensor | float,
    high: torch.Tensor | float,
) -> dict[str, Metric]:
    """TRL's clip-ratio metrics: fraction of tokens clipped low (r < low, A < 0), high (r > high, A > 0), either."""
    with torch.no_grad():
        is_low = ((ratio < low) & (advantages < 0)).float()
        is_high = ((ratio > high) & (advantages > 0)).float()
        return {
            "clip_ratio/low_mean": masked_metric(is_low, mask),
            "clip_ratio/high_mean": masked_metric(is_high, mask),
            "clip_ratio/region_mean": masked_metric(torch.maximum(is_low, is_high), mask),
        }
