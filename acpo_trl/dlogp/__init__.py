"""Δlog p toolkit: which tokens did RL training change, and can the change be amplified at test time?

After Huang et al. 2026, "On the Direction of RLVR Updates for LLM Reasoning" (arXiv 2603.22117):

- ``metrics``: per-token Δlog p, entropies and KLs from log-probs (exact, or the authors' top-k view);
- ``scoring``: teacher-forced, batched, vocabulary-chunked scoring of responses under a base/RL pair;
- ``analysis``: summary statistics, log-scale histograms, top tokens, per-token JSON;
- ``selection`` / ``sampling``: the selectors (Δlog p ≤ τ, entropy, KL, random, all, none) and π_Extra^γ;
- ``decoding``: batched two-model decoding with two KV caches (and the one-model reference sampler);
- ``runs`` / ``cli``: ``acpo-dlogp score`` and ``acpo-dlogp generate`` (avg@k of each decoding method).
"""

from .analysis import summary, top_tokens, write_analysis
from .decoding import DecodeConfig, Generation, eos_token_ids, single_model_generate, two_model_generate
from .metrics import METRICS, token_metrics, top_k_padded
from .sampling import candidate_probs, extrapolated_logits, sample_candidates, top_p_filter
from .scoring import encode_samples, score_responses
from .selection import CRITERIA, select

__all__ = [
    "CRITERIA",
    "METRICS",
    "DecodeConfig",
    "Generation",
    "candidate_probs",
    "encode_samples",
    "eos_token_ids",
    "extrapolated_logits",
    "sample_candidates",
    "score_responses",
    "select",
    "single_model_generate",
    "summary",
    "token_metrics",
    "top_k_padded",
    "top_p_filter",
    "top_tokens",
    "two_model_generate",
    "write_analysis",
]
