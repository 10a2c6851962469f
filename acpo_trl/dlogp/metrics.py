"""Per-token metrics comparing an RL model with its base, as pure functions of next-token log-probabilities.

Huang et al. 2026 ("On the Direction of RLVR Updates", arXiv 2603.22117, §2 and Fig. 1): at position t with the
token actually in the sequence y_t and both models teacher-forced on the same prefix,

    dlogp        = log π_RL(y_t) − log π_base(y_t)                    (signed: the direction of the update)
    entropy_m    = −Σ_y π_m(y) log π_m(y)                              (m = rl, base)
    kl_rl_base   = KL(π_RL ‖ π_base) = Σ_y π_RL(y) (log π_RL(y) − log π_base(y))
    kl_base_rl   = KL(π_base ‖ π_RL)
    kl_sym       = (kl_rl_base + kl_base_rl) / 2

All sums run over the full vocabulary (exact). With ``top_k`` the authors' view is emulated: their decoder only
sees each model's top-k log-probs (k = 50) and pads a token missing from a model's list with the minimum of that
list (``pad_lp = min(top-k log-probs)`` in their resampling code). Then dlogp uses the padded log-probs, an
entropy is taken over the model's own top-k renormalised (as their code does), and the KLs over the union of the
two top-k sets with padded, renormalised log-probs.
"""

from __future__ import annotations

import torch

METRICS = ("dlogp", "entropy_rl", "entropy_base", "kl_rl_base", "kl_base_rl", "kl_sym")


def delta_logp(logp_rl: torch.Tensor, logp_base: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Δlog p(y) = log π_RL(y) − log π_base(y) at ``tokens`` ([N]) from log-probs [N, V]."""
    index = tokens.long().unsqueeze(-1)
    return (logp_rl.gather(-1, index) - logp_base.gather(-1, index)).squeeze(-1)


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """H(π) = −Σ_y π(y) log π(y) over the last axis (terms with π(y) = 0 count 0)."""
    p = logp.exp()
    return torch.where(p > 0, -p * logp, torch.zeros_like(p)).sum(-1)


def kl(logp_p: torch.Tensor, logp_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = Σ_y p(y) (log p(y) − log q(y)) over the last axis (terms with p(y) = 0 count 0)."""
    p = logp_p.exp()
    return torch.where(p > 0, p * (logp_p - logp_q), torch.zeros_like(p)).sum(-1)


def top_k_padded(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' top-k view of log-probs [N, V]: (padded, in_top_k).

    ``padded`` keeps the top-k log-probs and gives every other token the smallest of them; ``in_top_k`` marks the
    top-k tokens.
    """
    if not 0 < k <= logp.shape[-1]:
        raise ValueError(f"top_k={k} must be between 1 and the vocabulary size {logp.shape[-1]}.")
    values, index = logp.topk(k, dim=-1)
    padded = values[..., -1:].expand_as(logp).clone().scatter_(-1, index, values)
    in_top_k = torch.zeros_like(logp, dtype=torch.bool).scatter_(-1, index, True)
    return padded, in_top_k


def _renormalised(logp: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """log-probs restricted to ``support`` and renormalised there (−inf elsewhere)."""
    return torch.log_softmax(logp.masked_fill(~support, float("-inf")), dim=-1)


def token_metrics(
    logp_rl: torch.Tensor,
    logp_base: torch.Tensor,
    tokens: torch.Tensor,
    top_k: int | None = None,
    names: tuple[str, ...] = METRICS,
) -> dict[str, torch.Tensor]:
    """The metrics ``names`` (a subset of ``METRICS``), each [N], from log-probs [N, V] and tokens [N].

    ``top_k=None`` is exact on the full vocabulary; ``top_k=k`` emulates the authors' top-k truncation and padding
    (module docstring).
    """
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise ValueError(f"Unknown metric(s) {unknown}: `names` must be taken from {METRICS}.")
    if logp_rl.shape != logp_base.shape:
        raise ValueError(
            f"The RL and base log-probs have shapes {tuple(logp_rl.shape)} and {tuple(logp_base.shape)}: "
            "the two models must share a tokenizer (same vocabulary size)."
        )
    exact = top_k is None
    if not exact:
        pad_rl, top_rl = top_k_padded(logp_rl, top_k)
        pad_base, top_base = top_k_padded(logp_base, top_k)
    out: dict[str, torch.Tensor] = {}
    if "dlogp" in names:
        out["dlogp"] = delta_logp(logp_rl, logp_base, tokens) if exact else delta_logp(pad_rl, pad_base, tokens)
    if "entropy_rl" in names:
        out["entropy_rl"] = entropy(logp_rl if exact else _renormalised(logp_rl, top_rl))
    if "entropy_base" in names:
        out["entropy_base"] = entropy(logp_base if exact else _renormalised(logp_base, top_base))
    if {"kl_rl_base", "kl_base_rl", "kl_sym"} & set(names):
        if exact:
            p, q = logp_rl, logp_base
        else:  # over the union of the two top-k sets, padded and renormalised
            union = top_rl | top_base
            p, q = _renormalised(pad_rl, union), _renormalised(pad_base, union)
        out["kl_rl_base"], out["kl_base_rl"] = kl(p, q), kl(q, p)
        out["kl_sym"] = 0.5 * (out["kl_rl_base"] + out["kl_base_rl"])
    return {name: out[name] for name in names}
