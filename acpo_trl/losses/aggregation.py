"""Aggregation of a per-token loss into the scalar a micro-batch back-propagates, for TRL's ``loss_type`` values,
with TRL's gradient-accumulation normalisation (all of it here, so that no caller rescales).

    grpo     mean over sequences of the token-mean within each sequence      (the ACPO paper's choice)
    bnpo     sum over tokens / number of tokens in the micro-batch
    dr_grpo  sum over tokens / (num sequences * max_completion_length)
    dapo     sum over tokens / number of tokens in the accumulation window (every micro-batch of the optimizer step)
    luspo    mean over sequences of the token-sum within each sequence       (TRL's length-unbiased aggregation)

All but dapo are micro-batch means, divided by the number of accumulated micro-batches so that their sum is
the optimizer step's mean. dapo's denominator already spans the window: TRL counts the valid tokens of the whole
rollout on all processes (``num_items_in_batch``), and a window holds ``accumulation_steps`` of the rollout's
``micro_batches_per_rollout`` micro-batches on each of ``num_processes`` processes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


class AggregatedLoss(NamedTuple):
    """``loss``: what the micro-batch back-propagates; ``value``: the micro-batch's objective as TRL logs it
    (``policy_loss``: before the accumulation division for all but dapo), detached."""

    loss: torch.Tensor
    value: torch.Tensor


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    max_completion_length: int | None = None,
    accumulation_steps: int = 1,
    rollout_tokens: torch.Tensor | float | None = None,
    micro_batches_per_rollout: int = 1,
    num_processes: int = 1,
) -> AggregatedLoss:
    """Reduce ``per_token_loss`` ``(B, T)`` over the masked-in tokens following ``loss_type`` (see the module doc).

    Args:
        accumulation_steps: micro-batches accumulated into this optimizer step (1 in evaluation).
        rollout_tokens: dapo only: valid tokens of the rollout on all processes (TRL's ``num_items_in_batch``).
            Without it, dapo normalises by this micro-batch's tokens.
        micro_batches_per_rollout: dapo only: micro-batches the rollout is split into on each process (TRL's
            ``steps_per_generation``; 1 in evaluation, where the batch is neither split nor accumulated).
        num_processes: dapo only: processes sharing the rollout.
    """
    masked = per_token_loss * mask
    if loss_type == "dapo":
        if rollout_tokens is None:
            window_tokens = mask.sum()
        else:
            window_tokens = rollout_tokens / num_processes * accumulation_steps / micro_batches_per_rollout
        loss = masked.sum() / torch.as_tensor(window_tokens, dtype=masked.dtype).clamp(min=1.0)
        return AggregatedLoss(loss, loss.detach())
    if loss_type == "grpo":
        value = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        value = masked.sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs `max_completion_length`.")
        value = masked.sum() / (per_token_loss.size(0) * max_completion_length)
    elif loss_type == "luspo":
        value = masked.sum(-1).mean()
    else:
        raise ValueError(f"Unknown loss_type {loss_type!r}: expected one of {LOSS_TYPES}.")
    return AggregatedLoss(value / accumulation_steps, value.detach())
