"""Gradient-direction diagnostics on one micro-batch, with ``torch.autograd.grad`` (the training gradient in
``.grad`` is not touched).

For the per-token loss l_t that the run actually uses and the unclipped importance-weighted surrogate
u_t = -A_t r_t on the same tokens (the on-policy policy gradient when r = 1), both aggregated with the run's
``loss_type`` (dapo's token-mean over this micro-batch: direction and norm ratio do not depend on the constant):

    grad/angle_deg          angle between g_used = d L_used / d theta and g_ref = d L_unclipped / d theta
    grad/cos                its cosine
    grad/norm_ratio         |g_used| / |g_ref|
    grad/share/bin{b}/{pos,neg}
                            <g_{b,s}, g_used> / |g_used|^2, with g_{b,s} the gradient of the used loss restricted
                            to the tokens of probability bin b (current probability, ACPO's bins) and advantage
                            sign s. The shares sum to 1 (the loss is additive over tokens): which probability group
                            dominates the update, and whether it pushes along it (> 0) or against it (< 0).
    grad/norm_share/bin{b}/{pos,neg}
                            |g_{b,s}| / sum over groups of |g_{b',s'}|

Cost: 2 + 2K backward passes through the part of the graph that reaches ``params`` (restrict ``params`` to a
named subset, e.g. the last block, to bound it), every N optimizer steps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import torch

from ..losses.acpo import probability_bins
from ..losses.aggregation import aggregate_loss
from ..losses.common import importance_ratio
from ..losses.registry import Metric


def select_parameters(model: torch.nn.Module, patterns: Sequence[str] | None = None) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable parameters whose name matches one of the regular expressions ``patterns`` (``re.search``),
    or all trainable parameters when ``patterns`` is empty. Raises if nothing matches."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if patterns:
        compiled = [re.compile(p) for p in patterns]
        named = [(n, p) for n, p in named if any(c.search(n) for c in compiled)]
    if not named:
        raise ValueError(f"No trainable parameter matches {list(patterns or [])}.")
    return named


def _flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, params)])


def gradient_diagnostics(
    per_token_loss: torch.Tensor,
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: Iterable[torch.Tensor],
    *,
    loss_type: str = "grpo",
    num_bins: int = 5,
    max_completion_length: int | None = None,
    per_group: bool = True,
    prefix: str = "grad",
) -> dict[str, Metric]:
    """The metrics of the module docstring. ``per_token_loss`` and ``logps`` must still hold their graph (call
    this before ``backward``); ``params`` are the tensors to differentiate with respect to."""
    params = list(params)
    adv = advantages.expand_as(logps)
    max_len = max_completion_length or logps.size(1)

    def aggregate(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(values, mask, loss_type, max_completion_length=max_len,
                              num_items=mask.sum().clamp(min=1.0))

    used = _flat_grad(aggregate(per_token_loss), params)
    ref = _flat_grad(aggregate(-adv * importance_ratio(logps, old_logps)), params)
    one = torch.ones((), dtype=torch.float64, device=logps.device)
    used_norm, ref_norm = used.norm().double(), ref.norm().double()
    metrics: dict[str, Metric] = {}
    if used_norm > 0 and ref_norm > 0:
        cos = torch.clamp(torch.dot(used.double(), ref.double()) / (used_norm * ref_norm), -1.0, 1.0)
        metrics[f"{prefix}/cos"] = (cos, one)
        metrics[f"{prefix}/angle_deg"] = (torch.rad2deg(torch.arccos(cos)), one)
        metrics[f"{prefix}/norm_ratio"] = (used_norm / ref_norm, one)
    metrics[f"{prefix}/norm_used"] = (used_norm, one)
    metrics[f"{prefix}/norm_unclipped"] = (ref_norm, one)
    if not per_group or used_norm == 0:
        return metrics
    with torch.no_grad():
        bins = probability_bins(logps, num_bins, mask)
        valid = mask.bool()
        signs = {"pos": (adv > 0) & valid, "neg": (adv < 0) & valid}
    shares, norms = {}, {}
    for b in range(num_bins):
        for sign, selector in signs.items():
            group = selector & (bins == b)
            if not bool(group.any()):
                shares[(b, sign)], norms[(b, sign)] = 0.0, 0.0
                continue
            g = _flat_grad(aggregate(per_token_loss * group), params).double()
            shares[(b, sign)] = float(torch.dot(g, used.double()) / used_norm**2)
            norms[(b, sign)] = float(g.norm())
    norm_total = sum(norms.values()) or math.inf
    for (b, sign), share in shares.items():
        metrics[f"{prefix}/share/bin{b}/{sign}"] = (torch.tensor(share, dtype=torch.float64, device=logps.device), one)
        metrics[f"{prefix}/norm_share/bin{b}/{sign}"] = (
            torch.tensor(norms[(b, sign)] / norm_total, dtype=torch.float64, device=logps.device), one)
    return metrics
