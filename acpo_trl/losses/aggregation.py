"""Aggregation of a per-token loss into a scalar, for TRL's ``loss_type`` values.

    grpo     mean over sequences of the token-mean within each sequence      (the ACPO paper's choice)
    bnpo     sum over tokens / number of tokens in the local micro-batch
    dr_grpo  sum over tokens / (num sequences * max_completion_length)
    dapo     sum over tokens / number of tokens in the whole accumulated batch (``num_items``)
"""

from __future__ import annotations

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    max_completion_length: int | None = None,
    num_items: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Reduce ``per_token_loss`` ``(B, T)`` over the masked-in tokens following ``loss_type`` (see module doc)."""
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs `max_completion_length`.")
        return masked.sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":
        if num_items is None:
            raise ValueError("loss_type='dapo' needs `num_items` (tokens in the accumulated batch).")
        return masked.sum() / num_items
    raise ValueError(f"Unknown loss_type {loss_type!r}: expected one of {LOSS_TYPES}.")
