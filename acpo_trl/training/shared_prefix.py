"""Scoring a micro-batch whose rows begin alike, with what they share computed once.

GRPO scores G completions of every prompt, and a task's prompts often open the same way (a system prompt, solved
examples): in the offline demo 77 of a prompt's 88 tokens are the same in every prompt, and each prompt comes with
8 completions. TRL's forward runs the model on every token of every row. With ``ACPOConfig.share_prompt_prefix``
the trainer instead (:func:`prompt_cache`)

1. finds the longest prefix that every row of the call has in common, tokens and attention mask alike
   (:func:`shared_prefix_length`), stopping before the last prompt token (whose logit scores the first completion
   token), and runs the model once on it (batch 1, :func:`prefix_cache`);
2. runs the rest of each distinct prompt once (batch: the number of distinct prompts) against that prefix's
   key/value cache;
3. runs each row's last prompt token and completion against its prompt's cache (:func:`select_cache`), through TRL's
   fused LM head, chunk by chunk as TRL's forward does.

Generation takes the same shortcut for step 1 (:func:`generate_with_shared_prefix`, transformers' documented
prompt-cache reuse): the rollouts of ``ACPOTrainer`` on the transformers backend and the held-out evaluations of
``acpo_trl.evaluation`` prefill the shared prefix once; their samples are the same as without it.

Positions, attention mask and causal structure are those of the full rows, so log-probs, entropies and gradients
equal TRL's up to float rounding (the gradient reaches a prompt's computation through its cache, summed over the
rows that use it, as the full forward sums it); ``tests/test_shared_prefix.py`` checks this against
``GRPOTrainer``. It needs the model's cache, so it is refused with gradient checkpointing, and it is not used under
DeepSpeed or FSDP (untested there).
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from typing import NamedTuple

import torch

# A shorter shared prefix takes TRL's path: it would save a few tokens per row for an extra forward call.
MIN_SHARED_TOKENS = 8


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> int:
    """The number of leading columns on which every row of ``input_ids`` and ``attention_mask`` agrees, capped at
    ``T - logits_to_keep - 1`` so that the rest of each row still holds the token that predicts the first of the
    ``logits_to_keep`` scored ones. One host sync."""
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask == attention_mask[:1]).all(0)
    common = int(same.long().cumprod(0).sum())
    return max(0, min(common, input_ids.size(1) - logits_to_keep - 1))


def cache_argument(model) -> str:
    """The name under which ``model``'s forward takes a key/value cache: ``cache`` (transformers >= 5.24) or
    ``past_key_values`` (earlier)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _returned_cache(model, output):
    cache = getattr(output, "cache", None)
    if cache is None:
        cache = getattr(output, "past_key_values", None)
    if cache is None:
        raise RuntimeError(f"{type(model).__name__} returned no key/value cache with use_cache=True; set "
                           "share_prompt_prefix: false.")
    return cache


def prefix_cache(model, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor):
    """The key/value cache of ``model`` on one row's prefix (``(1, L)`` ids and mask); gradients flow from it to
    the prefix's forward. ``model`` is called as it is (not through a DDP wrapper: DDP's gradient hooks sit on the
    parameters, which the later call through the wrapper also reaches)."""
    return _returned_cache(model, model(input_ids=prefix_ids, attention_mask=prefix_mask, use_cache=True,
                                        logits_to_keep=1))


def select_cache(cache, index: torch.Tensor):
    """A new cache of ``cache``'s type whose row i holds ``cache``'s row ``index[i]`` (``cache`` is left as it is,
    for the next chunk; gradients flow back to its states, summed over the rows that share one)."""
    return type(cache)([(keys.index_select(0, index), values.index_select(0, index), *rest)
                        for keys, values, *rest in cache])


class PromptCache(NamedTuple):
    """Steps 1-2 of the module docstring: the key/value states of each distinct prompt up to column ``end``
    (``cache``, one row per distinct prompt) and, per row of the call, the index of its prompt (``row_prompt``)."""

    cache: object
    row_prompt: torch.Tensor
    end: int


def prompt_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, shared: int, prompt_end: int,
                 cache_argument: str) -> PromptCache:
    """Run the prefix of ``shared`` columns once, then each distinct prompt's columns ``[shared, prompt_end)`` once
    against it. ``prompt_end`` is the last prompt column, which stays with the rows; ``shared`` <= ``prompt_end``."""
    prefix = prefix_cache(model, input_ids[:1, :shared], attention_mask[:1, :shared])
    rows = input_ids.size(0)
    if prompt_end == shared:
        return PromptCache(prefix, input_ids.new_zeros(rows), shared)
    rests = torch.cat([input_ids[:, shared:prompt_end], attention_mask[:, shared:prompt_end]], dim=1)
    _, row_prompt = torch.unique(rests, dim=0, return_inverse=True)
    prompts = int(row_prompt.max()) + 1
    first = torch.full((prompts,), rows, device=input_ids.device).scatter_reduce(
        0, row_prompt, torch.arange(rows, device=input_ids.device), "amin")  # a row of each distinct prompt
    output = model(input_ids=input_ids[first, shared:prompt_end], attention_mask=attention_mask[first, :prompt_end],
                   use_cache=True, logits_to_keep=1, **{cache_argument: select_cache(prefix, first.new_zeros(prompts))})
    return PromptCache(_returned_cache(model, output), row_prompt, prompt_end)


def score_with_shared_prefix(model, unwrapped, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             logits_to_keep: int, batch_size: int | None, compute_entropy: bool, cache_arg: str,
                             autocast) -> tuple[torch.Tensor, torch.Tensor | None, None] | None:
    """TRL's ``_get_per_token_logps_and_entropies`` (log-probs and entropies of the last ``logits_to_keep`` tokens,
    no aux loss) computed as the module docstring says: the prefix and each distinct prompt once (on the
    ``unwrapped`` model), then each chunk of ``batch_size`` rows' completions through ``model`` against its prompt's
    cache with TRL's fused LM head. None when the rows share fewer than ``MIN_SHARED_TOKENS`` tokens (TRL's path
    then). ``autocast``: the accelerator's autocast context factory."""
    shared = shared_prefix_length(input_ids, attention_mask, logits_to_keep)
    if shared < MIN_SHARED_TOKENS:
        return None
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-logits_to_keep] = -100
    with autocast():  # the last prompt token stays with its row: its logit scores the first completion token
        prompts = prompt_cache(unwrapped, input_ids, attention_mask, shared, input_ids.size(1) - logits_to_keep - 1,
                               cache_arg)
    batch_size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        rows = slice(start, start + batch_size)
        with autocast():
            outputs = model(input_ids=input_ids[rows, prompts.end:], attention_mask=attention_mask[rows],
                            labels=labels[rows, prompts.end:], fused_lm_head=True,
                            **{cache_arg: select_cache(prompts.cache, prompts.row_prompt[rows])})
        logps.append(outputs.log_probs[:, -logits_to_keep:])
        entropies.append(outputs.entropy[:, -logits_to_keep:] if compute_entropy else None)
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None


def generate_with_shared_prefix(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config,
                                logits_processor=None, **kwargs):
    """``model.generate`` with the prefix that every prompt row shares prefilled once and its cache handed to
    ``generate`` (``logits_processor``: ``generate``'s, passed on). Plain ``generate`` when the rows share fewer than
    ``MIN_SHARED_TOKENS`` tokens, when other model inputs come along (images) or the config asks for its own cache
    implementation."""
    generate = type(model).generate
    shared = shared_prefix_length(input_ids, attention_mask, logits_to_keep=0)
    rows = input_ids.size(0) * (generation_config.num_return_sequences or 1)
    if rows < 2 or shared < MIN_SHARED_TOKENS or generation_config.cache_implementation is not None or kwargs:
        return generate(model, input_ids=input_ids, attention_mask=attention_mask,
                        generation_config=generation_config, logits_processor=logits_processor, **kwargs)
    prefix = prefix_cache(model, input_ids[:1, :shared], attention_mask[:1, :shared])
    cache = select_cache(prefix, input_ids.new_zeros(rows))
    return generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                    logits_processor=logits_processor, **{cache_argument(model): cache}, **kwargs)


@contextmanager
def shared_prefix_generation(model):
    """Within the block, ``model.generate`` is :func:`generate_with_shared_prefix` (for a caller that calls
    ``generate`` itself, as TRL's rollout does)."""
    model.generate = functools.partial(generate_with_shared_prefix, model)
    try:
        yield
    finally:
        del model.generate
