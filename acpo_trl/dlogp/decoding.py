"""Two-model decoding with two KV caches, batched (Huang et al. 2026, §3-4), and the matching one-model sampler.

Both models read the same prefix at every step. With ``driver="base"`` (the paper's intervention):

1. sample y_b from π_base (temperature T, top-p);
2. ``selection.select`` decides whether the position defers to the RL model (e.g. Δlog p(y_b) ≤ τ);
3. a selected position instead samples π_Extra^γ over the base top-k candidates (``sampling``): γ = 0 is
   selective replacement, γ > 0 selective extrapolation; otherwise y_b is kept.

``driver="rl"`` is the earlier non-selective variant: every token is sampled from π_Extra^γ over the RL model's
top-k (criterion ``"all"``). A response ends at its first end-of-sequence token (kept in the response): the
tokenizer's EOS plus the model's generation-config EOS ids, i.e. the chat template's end-of-turn token.
The replacement ratio of a response is its number of selected positions over its number of generated tokens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..utils.number_checks import AT_LEAST_ONE, POSITIVE, UNIT_NOT_ZERO, check_numbers
from .metrics import top_k_padded
from .sampling import sample_candidates, sample_tokens
from .selection import CRITERIA, select

DRIVERS = ("base", "rl")
# Checked at construction (acpo_trl/utils/number_checks.py); tau and gamma, any sign, are checked finite.
DECODE_RANGES = {"top_k": AT_LEAST_ONE, "temperature": POSITIVE, "top_p": UNIT_NOT_ZERO, "max_new_tokens": AT_LEAST_ONE}


@dataclass(frozen=True)
class DecodeConfig:
    """Sampling and selection settings of two-model decoding (defaults: the paper's T = 1, k = 50, τ = −0.3)."""

    criterion: str = "dlogp"
    tau: float = -0.3
    gamma: float = 0.0
    top_k: int = 50
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    driver: str = "base"
    emulate_top_k: bool = False

    def __post_init__(self):
        check_numbers(self, DECODE_RANGES)
        if self.criterion not in CRITERIA:
            raise ValueError(f"Unknown criterion {self.criterion!r}: `criterion` must be one of {CRITERIA}.")
        if self.driver not in DRIVERS:
            raise ValueError(f"Unknown driver {self.driver!r}: `driver` must be one of {DRIVERS}.")
        if self.driver == "rl" and self.criterion != "all":
            raise ValueError('driver="rl" is the non-selective variant: set criterion="all".')


@dataclass
class Generation:
    """Generated response token ids (EOS included when reached) and, per token, whether it was selected."""

    responses: list[list[int]]
    selected: list[list[bool]]

    @property
    def replacement_ratios(self) -> list[float]:
        """Selected / generated tokens, per response (0 for an empty response)."""
        return [sum(s) / len(s) if s else 0.0 for s in self.selected]


def eos_token_ids(tokenizer, *models) -> list[int]:
    """The ids that end a response: the tokenizer's EOS (the chat template's end of turn) and each model's
    ``generation_config.eos_token_id``."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for model in models:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    if not ids:
        raise ValueError("No end-of-sequence token: set `tokenizer.eos_token` (or the model's generation_config).")
    return sorted(ids)


def two_model_step(
    logp_base: torch.Tensor, logp_rl: torch.Tensor, config: DecodeConfig, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step from both models' next-token log-probs [B, V]: (token ids [B], selected [B])."""
    k, temperature, top_p = config.top_k, config.temperature, config.top_p
    if config.driver == "rl":
        base_view = top_k_padded(logp_base, k)[0] if config.emulate_top_k else logp_base
        candidates = logp_rl.topk(k, dim=-1).indices
        tokens = sample_candidates(logp_rl, base_view, candidates, config.gamma, temperature, top_p, generator)
        return tokens, torch.ones_like(tokens, dtype=torch.bool)
    tokens = sample_tokens(logp_base, temperature, top_p, generator)
    view_k = k if config.emulate_top_k else None
    selected = select(config.criterion, config.tau, logp_rl, logp_base, tokens, generator, top_k=view_k)
    if selected.any():
        rl_view = top_k_padded(logp_rl[selected], k)[0] if config.emulate_top_k else logp_rl[selected]
        candidates = logp_base[selected].topk(k, dim=-1).indices
        tokens = tokens.clone()
        tokens[selected] = sample_candidates(
            rl_view, logp_base[selected], candidates, config.gamma, temperature, top_p, generator
        )
    return tokens, selected


def _cache_argument(model) -> str:
    """The name of the KV-cache argument and output: ``cache`` in transformers >= 5.2x, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _next_logp(model, cache_name, input_ids, attention_mask, position_ids, cache):
    """Next-token log-probs [B, V] (float32) and the updated KV cache."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{cache_name: cache},
    )
    return torch.log_softmax(out.logits[:, -1].float(), dim=-1), out[cache_name]


def _decode(
    models: Sequence,
    prompt_ids: Sequence[Sequence[int]],
    choose: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_token_id: int,
) -> Generation:
    """The batched loop shared by one- and two-model decoding: one KV cache per model, left-padded prompts."""
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("`prompt_ids` must hold at least one prompt, and every prompt at least one token.")
    device = next(models[0].parameters()).device
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, p in enumerate(prompt_ids):
        input_ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        attention_mask[i, width - len(p) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache_names = [_cache_argument(m) for m in models]
    states = [_next_logp(m, c, input_ids, attention_mask, positions, None) for m, c in zip(models, cache_names)]
    eos = torch.tensor(list(eos_ids), device=device)
    finished = torch.zeros(len(prompt_ids), dtype=torch.bool, device=device)
    position = positions[:, -1:]
    steps_tokens, steps_selected, steps_alive = [], [], []
    for _ in range(max_new_tokens):
        tokens, selected = choose(*(logp for logp, _ in states))
        tokens = tokens.masked_fill(finished, pad_token_id)
        steps_tokens.append(tokens)
        steps_selected.append(selected & ~finished)
        steps_alive.append(~finished)
        finished = finished | torch.isin(tokens, eos)
        if bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=-1)
        position = position + 1
        states = [
            _next_logp(m, c, tokens[:, None], attention_mask, position, cache)
            for m, c, (_, cache) in zip(models, cache_names, states)
        ]
    tokens, selected, alive = (torch.stack(x, dim=1).cpu() for x in (steps_tokens, steps_selected, steps_alive))
    return Generation(
        responses=[t[a].tolist() for t, a in zip(tokens, alive)],
        selected=[s[a].tolist() for s, a in zip(selected, alive)],
    )


@torch.inference_mode()
def two_model_generate(
    base,
    rl,
    prompt_ids: Sequence[Sequence[int]],
    config: DecodeConfig,
    *,
    eos_ids: Sequence[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> Generation:
    """Decode ``prompt_ids`` (a batch of token-id lists) with the base model driving and the RL model consulted at
    the positions ``config.criterion`` selects (module docstring)."""
    if base.config.vocab_size != rl.config.vocab_size:
        raise ValueError(
            f"Base vocab_size {base.config.vocab_size} != RL vocab_size {rl.config.vocab_size}: "
            "two-model decoding needs models that share a tokenizer."
        )
    return _decode(
        [base, rl],
        prompt_ids,
        lambda logp_base, logp_rl: two_model_step(logp_base, logp_rl, config, generator),
        config.max_new_tokens,
        eos_ids,
        pad_token_id,
    )


@torch.inference_mode()
def single_model_generate(
    model,
    prompt_ids: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 512,
    eos_ids: Sequence[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> Generation:
    """Plain sampling from one model with the same loop (the reference for two-model decoding; nothing selected)."""
    DecodeConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)  # validates the settings

    def choose(logp):
        tokens = sample_tokens(logp, temperature, top_p, generator)
        return tokens, torch.zeros_like(tokens, dtype=torch.bool)

    return _decode([model], prompt_ids, choose, max_new_tokens, eos_ids, pad_token_id)
