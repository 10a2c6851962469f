"""Sampling distributions of two-model decoding, as pure functions of log-probabilities.

Test-time extrapolation (Huang et al. 2026, §4): over the candidate set C (the base model's top-k, k = 50),

    logits(y) = (1 + γ) log π_RL(y) − γ log π_base(y) = log π_RL(y) + γ Δlog p(y),   y ∈ C,

divided by the temperature T, nucleus-filtered (top-p), softmaxed. γ = 0 samples π_RL restricted to C and
renormalised (selective replacement). Top-p follows vLLM and the authors' code: sort ascending and drop the
tokens whose cumulative probability is ≤ 1 − p, always keeping the most probable one.
"""

from __future__ import annotations

import torch


def extrapolated_logits(logp_rl: torch.Tensor, logp_base: torch.Tensor, gamma: float) -> torch.Tensor:
    """(1 + γ) log π_RL − γ log π_base, elementwise."""
    return (1.0 + gamma) * logp_rl - gamma * logp_base


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logits`` with −inf outside the nucleus of mass ``top_p`` (last axis)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1)  # ascending
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1.0 - top_p
    drop[..., -1] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """softmax(top_p_filter(logits / T)) over the last axis."""
    return top_p_filter(logits / temperature, top_p).softmax(dim=-1)


def candidate_probs(
    logp_rl: torch.Tensor,
    logp_base: torch.Tensor,
    candidates: torch.Tensor,
    gamma: float,
    temperature: float,
    top_p: float,
) -> torch.Tensor:
    """π_Extra^γ over ``candidates`` [B, k] (token ids), as probabilities [B, k], from log-probs [B, V]."""
    logits = extrapolated_logits(logp_rl.gather(-1, candidates), logp_base.gather(-1, candidates), gamma)
    return sampling_probs(logits, temperature, top_p)


def sample_candidates(
    logp_rl: torch.Tensor,
    logp_base: torch.Tensor,
    candidates: torch.Tensor,
    gamma: float,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token ids [B] drawn from :func:`candidate_probs`."""
    probs = candidate_probs(logp_rl, logp_base, candidates, gamma, temperature, top_p)
    pick = torch.multinomial(probs, 1, generator=generator)
    return candidates.gather(-1, pick).squeeze(-1)


def sample_tokens(
    logp: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Token ids [B] drawn from one model's log-probs [B, V] with temperature and top-p."""
    return torch.multinomial(sampling_probs(logp, temperature, top_p), 1, generator=generator).squeeze(-1)
