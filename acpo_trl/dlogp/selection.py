"""Which decoding positions defer to the RL model: the selectors of Huang et al. 2026, §3 and Fig. 1(c).

At each step the base model has sampled y_b; a position is selected when

    dlogp:    log π_RL(y_b) − log π_base(y_b) ≤ τ      (the paper's criterion; τ = −0.3 … −0.4 in its runs)
    entropy:  H(π_base) ≥ τ                             (the driving model's next-token entropy)
    kl:       KL(π_RL ‖ π_base) ≥ τ
    random:   u ≤ τ with u ~ U(0, 1)                     (τ is the replacement rate)
    all / none: every / no position (τ unused).
"""

from __future__ import annotations

import torch

from .metrics import token_metrics

CRITERIA = ("dlogp", "entropy", "kl", "random", "all", "none")


def select(
    criterion: str,
    tau: float,
    logp_rl: torch.Tensor,
    logp_base: torch.Tensor,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    top_k: int | None = None,
) -> torch.Tensor:
    """Boolean [B]: the positions whose base token ``tokens`` [B] is handed to the RL model, from log-probs [B, V].

    ``top_k`` computes the metric on the authors' top-k view (``metrics.token_metrics``); ``None`` is exact. Only
    ``random`` draws from ``generator``.
    """
    batch = tokens.shape[0]
    if criterion == "dlogp":
        return token_metrics(logp_rl, logp_base, tokens, top_k, names=("dlogp",))["dlogp"] <= tau
    if criterion == "entropy":
        return token_metrics(logp_rl, logp_base, tokens, top_k, names=("entropy_base",))["entropy_base"] >= tau
    if criterion == "kl":
        return token_metrics(logp_rl, logp_base, tokens, top_k, names=("kl_rl_base",))["kl_rl_base"] >= tau
    if criterion == "random":
        return torch.rand(batch, generator=generator, device=tokens.device) <= tau
    if criterion == "all":
        return torch.ones(batch, dtype=torch.bool, device=tokens.device)
    if criterion == "none":
        return torch.zeros(batch, dtype=torch.bool, device=tokens.device)
    raise ValueError(f"Unknown selection criterion {criterion!r}: `criterion` must be one of {CRITERIA}.")
