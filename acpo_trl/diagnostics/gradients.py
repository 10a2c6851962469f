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
        return aggregate_loss(values, mask, loss_type, max_completion_length=max_len).loss

    used = _flat_grad(aggregate(per_token_loss), params).double()
    ref = _flat_grad(aggregate(-adv * importance_ratio(logps, old_logps)), params).double()
    one = torch.ones((), dtype=torch.float64, device=logps.device)
    used_norm, ref_norm = used.norm(), ref.norm()
    # The same names whatever the data (metrics are summed over processes by name position): a value that is
    # undefined here (a zero gradient, e.g. a micro-batch whose advantages are all 0) is the pair (0, 0), missing.
    defined = ((used_norm > 0) & (ref_norm > 0)).double()
    cos = torch.clamp(torch.dot(used, ref) / (used_norm * ref_norm).clamp(min=1e-300), -1.0, 1.0) * defined
    metrics: dict[str, Metric] = {
        f"{prefix}/cos": (cos, defined),
        f"{prefix}/angle_deg": (torch.rad2deg(torch.arccos(cos)) * defined, defined),
        f"{prefix}/norm_ratio": (used_norm / ref_norm.clamp(min=1e-300) * defined, defined),
        f"{prefix}/norm_used": (used_norm, one),
        f"{prefix}/norm_unclipped": (ref_norm, one),
    }
    if not per_group:
        return metrics
    with torch.no_grad():
        bins = probability_bins(logps, num_bins, mask)
        valid = mask.bool()
        signs = {"pos": (adv > 0) & valid, "neg": (adv < 0) & valid}
    has_used = (used_norm > 0).double()
    groups = [(b, sign, selector & (bins == b)) for b in range(num_bins) for sign, selector in signs.items()]
    # An empty group's gradient is 0 (no backward pass needed); with a zero used gradient no share is defined
    # (has_used = 0), so no group is differentiated.
    grads = [_flat_grad(aggregate(per_token_loss * group), params).double() if has_used and bool(group.any())
             else None for _, _, group in groups]
    norms = torch.stack([g.norm() if g is not None else used_norm.new_zeros(()) for g in grads])
    norm_total = norms.sum()
    for (b, sign, _), g, norm in zip(groups, grads, norms):
        share = torch.dot(g, used) / used_norm.clamp(min=1e-300) ** 2 if g is not None else used_norm.new_zeros(())
        metrics[f"{prefix}/share/bin{b}/{sign}"] = (share * has_used, has_used)
        metrics[f"{prefix}/norm_share/bin{b}/{sign}"] = (norm / norm_total.clamp(min=1e-300) * has_used, has_used)
    return metrics
