"""Teacher-forced, batched scoring of responses under an RL model and its base: per-token ``METRICS``.

Both models read the same ``prompt + response`` token ids (right-padded batches); the next-token distributions at
the response positions are compared with :func:`acpo_trl.dlogp.metrics.token_metrics`. Memory stays bounded on
long responses: each model's backbone runs once per batch, and the vocabulary projection, the log-softmax and the
metrics run over at most ``chunk_tokens`` response positions at a time, so no [batch, length, vocab] tensor is
ever built.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..evaluation.generation import tokenize_prompt
from ..rewards.common import completion_text
from .metrics import METRICS, token_metrics


def encode_samples(tokenizer, prompts: Sequence[Any], completions: Sequence[Any]) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, response ids) for text samples, e.g. the ``prompt``/``completion`` fields of an acpo-eval file.

    Prompts are tokenised as acpo-eval and TRL do (``tokenize_prompt``). A completion is a string or a conversation
    (its assistant text is used); it is re-tokenised without special tokens, so an end-of-turn token that the text
    does not contain is not scored.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"Got {len(prompts)} prompts but {len(completions)} completions: give one completion per prompt.")
    prompt_ids = [tokenize_prompt(tokenizer, p) for p in prompts]
    response_ids = [tokenizer(completion_text(c), add_special_tokens=False)["input_ids"] for c in completions]
    return prompt_ids, response_ids


def _hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states [B, L, H] of a causal LM's backbone (no vocabulary projection)."""
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(model.config, attr, None) not in (None, 1.0):
            raise ValueError(
                f"{type(model).__name__} post-processes its logits ({attr}); the chunked scorer applies only the "
                "output embedding. Score this model with a plain causal LM head."
            )
    return model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@torch.inference_mode()
def score_responses(
    base,
    rl,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    batch_size: int = 4,
    chunk_tokens: int = 1024,
    top_k: int | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Per-token ``METRICS`` of each response ([len(response)] float32 tensors on CPU), teacher-forced.

    ``top_k`` emulates the authors' top-k view (see ``metrics``); ``None`` is exact. ``chunk_tokens`` bounds the
    number of response positions projected onto the vocabulary at once.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"Got {len(prompt_ids)} prompts but {len(response_ids)} responses: give one response per prompt.")
    if batch_size < 1 or chunk_tokens < 1:
        raise ValueError(f"batch_size={batch_size} and chunk_tokens={chunk_tokens} must both be >= 1.")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("An empty prompt cannot be scored: the first response token needs a prefix to condition on.")
    device = next(base.parameters()).device
    head_base, head_rl = base.get_output_embeddings(), rl.get_output_embeddings()
    results: list[dict[str, torch.Tensor]] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts, responses = prompt_ids[start : start + batch_size], response_ids[start : start + batch_size]
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        length = max(len(s) for s in seqs)
        input_ids = torch.zeros((len(seqs), length), dtype=torch.long)  # right padding: never attended to
        attention_mask = torch.zeros_like(input_ids)
        for i, s in enumerate(seqs):
            input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            attention_mask[i, : len(s)] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Row i, position P_i - 1 + j predicts response token j (P_i = prompt length).
        rows = torch.cat([torch.full((len(r),), i, dtype=torch.long) for i, r in enumerate(responses)])
        cols = torch.cat([torch.arange(len(p) - 1, len(p) - 1 + len(r)) for p, r in zip(prompts, responses)]).long()
        targets = input_ids[rows, cols + 1]
        h_base = _hidden_states(base, input_ids, attention_mask)[rows, cols]
        h_rl = _hidden_states(rl, input_ids, attention_mask)[rows, cols]
        values = {name: [] for name in METRICS}
        for c in range(0, len(targets), chunk_tokens):
            logp_base = torch.log_softmax(head_base(h_base[c : c + chunk_tokens]).float(), dim=-1)
            logp_rl = torch.log_softmax(head_rl(h_rl[c : c + chunk_tokens]).float(), dim=-1)
            for name, v in token_metrics(logp_rl, logp_base, targets[c : c + chunk_tokens], top_k).items():
                values[name].append(v.cpu())
        flat = {name: torch.cat(v) if v else torch.zeros(0) for name, v in values.items()}
        offsets = [0]
        for r in responses:
            offsets.append(offsets[-1] + len(r))
        for i in range(len(responses)):
            results.append({name: flat[name][offsets[i] : offsets[i + 1]] for name in METRICS})
    return results
