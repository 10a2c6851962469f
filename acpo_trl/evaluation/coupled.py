r"""The coupled sampler: Gumbel-max sampling with noise keyed by (seed, problem, sample, position, token), not by batch.

Rule (the Gumbel-max trick). With ``z`` the logits after transformers' ``TemperatureLogitsWarper`` and
``TopPLogitsWarper`` (the multinomial sampler's warpers, so the same nucleus; tokens outside it are ``-inf``),

    x_t = argmax_v  z_v + G_v,    G_v = -log(-log U_v),    U_v ~ Uniform(0, 1) i.i.d.

is a sample of ``softmax(z)``: exact sampling at the configured temperature and top-p. Coupled autoregressive
generation (arXiv 2502.01754) takes ``U`` not from a random stream but from a key, so that two models
evaluated with the same seed draw the same ``U`` at every (problem, sample, position, token):

    k      = first 8 bytes of sha256(seed / sample index / the prompt's token ids)     one per completion
    s_t    = mix(k   + (t + 1) phi)        t: completion tokens generated so far
    h_t,v  = mix(s_t + (v + 1) phi)        v: token id
    U_t,v  = (h_t,v >> 11 + 1/2) / 2^53    in (0, 1), 53 bits

``phi`` = 0x9E3779B97F4A7C15 and ``mix`` are splitmix64's increment and output function (Steele, Lea & Flood 2014;
Vigna's splitmix64.c): ``s_t`` is output t of the splitmix64 stream seeded with ``k``, ``h_t,v`` output v of the
stream seeded with ``s_t``. Identical models give identical completions; models that differ slightly pick the same
token wherever their perturbed argmax agrees; and a completion whose token t differs keeps the same noise at t + 1,
t + 2, ... (the key holds its position, not a count of draws). Nothing depends on the batch the problem is sampled
in (its size, its other problems, their order, the padding) nor on the device: the noise is integer arithmetic, so
only the logits' float rounding under another batch shape can move a near-tie.

Integer semantics. splitmix64 works in uint64; torch has int64, whose add and multiply wrap modulo 2^64 (two's
complement), which is uint64's arithmetic on the same bits. Right shifts of int64 are arithmetic (sign-extending),
so each is masked into a logical shift. ``tests/test_eval_coupled.py`` checks the tensors against a pure-Python
splitmix64 with explicit ``mod 2^64`` (on CPU; CUDA's integer units wrap alike, not tested here).

Cost: about a dozen int64 and float64 operations per logit per step, vectorised over the vocabulary and the rows
(``benchmarks/coupled_sampler.py`` measures it against the multinomial sampler).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper


def _int64(value: int) -> int:
    """The int64 with the bits of the uint64 ``value mod 2^64``."""
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


PHI = _int64(0x9E3779B97F4A7C15)  # splitmix64's increment (2^64 / golden ratio)
_MULTIPLIERS = (_int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB))


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function on the int64 tensor ``z``, in place (a temporary of ``z``'s size, no more)."""
    shifted = torch.empty_like(z)
    for shift, multiplier in zip((30, 27), _MULTIPLIERS):
        torch.bitwise_right_shift(z, shift, out=shifted).bitwise_and_((1 << (64 - shift)) - 1)
        z.bitwise_xor_(shifted).mul_(multiplier)
    torch.bitwise_right_shift(z, 31, out=shifted).bitwise_and_((1 << 33) - 1)
    return z.bitwise_xor_(shifted)


def completion_keys(seed: int, prompt_ids: Sequence[Sequence[int]], num_samples: int) -> list[int]:
    """The key ``k`` of each row of a ``generate`` call with ``num_return_sequences=num_samples``: rows are
    prompt-major (row ``i * num_samples + j`` is sample ``j`` of prompt ``i``). A prompt is identified by its token
    ids, so its key does not depend on which other problems are evaluated, or in which order."""
    return [
        int.from_bytes(hashlib.sha256(f"{seed}/{j}/{','.join(map(str, ids))}".encode()).digest()[:8], "little",
                       signed=True)
        for ids in prompt_ids
        for j in range(num_samples)
    ]


def gumbel_noise(keys: torch.Tensor, position: int, vocab_size: int) -> torch.Tensor:
    """``G_t,v`` (module docstring) for every row key in ``keys`` (int64, ``(rows,)``) at completion position
    ``position``: a float64 ``(rows, vocab_size)`` tensor."""
    states = _mix_(keys + _int64((position + 1) * PHI))
    tokens = torch.arange(1, vocab_size + 1, device=keys.device, dtype=torch.int64).mul_(PHI)
    bits = _mix_(states[:, None] + tokens)
    uniform = torch.bitwise_right_shift(bits, 11).bitwise_and_((1 << 53) - 1).double().add_(0.5).mul_(2.0**-53)
    return uniform.log_().neg_().log_().neg_()


class KeyedGumbelNoise(LogitsProcessor):
    """Adds ``G_t,v`` to the scores, in float64, for ``generate`` to take their argmax (greedy decoding): the last
    processor of :func:`coupled_logits_processors`. ``keys``: one per row (:func:`completion_keys`);
    ``prompt_width``: the padded prompt length, so that ``t`` counts completion tokens whatever the padding."""

    def __init__(self, keys: Sequence[int], prompt_width: int):
        self.keys = torch.tensor(keys, dtype=torch.int64)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        noise = gumbel_noise(self.keys.to(scores.device), input_ids.shape[1] - self.prompt_width, scores.shape[-1])
        return noise.add_(scores)  # -inf outside the nucleus stays -inf


def coupled_logits_processors(temperature: float, top_p: float, keys: Sequence[int], prompt_width: int):
    """Temperature, top-p (transformers' warpers, as multinomial sampling applies them) and the keyed noise, for a
    ``generate`` call with ``do_sample=False``. ``temperature`` must be positive (greedy decoding draws no noise)."""
    processors = LogitsProcessorList()
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    processors.append(KeyedGumbelNoise(keys, prompt_width))
    return processors
