"""End-to-end runs behind ``acpo-dlogp``: load a base/RL pair, score responses (sampled here or read from an
acpo-eval output), and compare decoding methods on a benchmark with the project's rewards (avg@k).

Methods (Huang et al. 2026, §3-4), all with the same seeds on the same problems:

- ``base`` / ``rl``: each model alone (one-model sampling, same loop);
- ``replace``: base-driven, selected positions sample π_RL over the base top-k (γ = 0);
- ``extrapolate``: the same with γ > 0 (π_Extra^γ at selected positions);
- ``nonselective``: the RL model drives and every token samples π_Extra^γ over the RL top-k.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch

from ..evaluation.generation import Generation as EvalGeneration
from ..evaluation.generation import derive_seed, load_model_and_tokenizer, render_prompt, tokenize_prompt
from ..evaluation.metrics import summarize
from ..evaluation.report import markdown_table
from ..evaluation.store import SAMPLES_FILE
from ..utils.offline_model import offline_model_path
from .analysis import records_from_scores, write_analysis
from .decoding import DecodeConfig, Generation, eos_token_ids, single_model_generate, two_model_generate
from .scoring import score_responses

METHODS = ("base", "rl", "replace", "extrapolate", "nonselective")
OFFLINE = "offline"


def _paper_decode() -> DecodeConfig:
    return DecodeConfig(gamma=0.1, top_p=0.7, max_new_tokens=1024)


@dataclass(frozen=True)
class RunSettings:
    """A comparison run: the decoding settings shared by every method (``decode``: the paper's protocol, T = 1,
    top-p = 0.7, top-k 50, τ = −0.3; its ``gamma`` is the strength of ``extrapolate`` and ``nonselective``) and
    the sampling protocol (``k`` samples per problem, ``batch_size``, ``seed``)."""

    decode: DecodeConfig = field(default_factory=_paper_decode)
    k: int = 4
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self):
        if self.decode.driver != "base":
            raise ValueError("RunSettings.decode.driver: the method chooses the driver (`nonselective` is the "
                             "RL-driven one); leave driver='base'.")
        if self.k < 1 or self.batch_size < 1:
            raise ValueError(f"k={self.k} and batch_size={self.batch_size} must both be >= 1.")

    def decode_config(self, method: str) -> DecodeConfig:
        """The two-model settings of ``method`` (``base`` and ``rl`` decode one model with the same T and top-p)."""
        if method not in METHODS:
            raise ValueError(f"Unknown method {method!r}: methods must be taken from {METHODS}.")
        if method == "extrapolate":
            return self.decode
        if method == "nonselective":
            return replace(self.decode, criterion="all", driver="rl")
        return replace(self.decode, gamma=0.0)


def load_pair(base: str, rl: str, dtype: str = "auto", device: str | None = None):
    """(base model, RL model, tokenizer) from two checkpoints; ``"offline"`` names the offline SmolLM2-135M-Instruct.

    The tokenizer is the base checkpoint's; the two vocabularies must agree.
    """
    paths = [offline_model_path() if p == OFFLINE else p for p in (base, rl)]
    base_model, tokenizer = load_model_and_tokenizer(paths[0], dtype=dtype, device=device)
    rl_model, _ = load_model_and_tokenizer(paths[1], dtype=dtype, device=device)
    if base_model.config.vocab_size != rl_model.config.vocab_size:
        raise ValueError(
            f"--base has vocab_size {base_model.config.vocab_size} but --rl has {rl_model.config.vocab_size}: "
            "Δlog p needs an RL model trained from the base (same tokenizer)."
        )
    return base_model, rl_model, tokenizer


def generate(method: str, base, rl, tokenizer, prompt_ids, settings: RunSettings, seed: int) -> Generation:
    """Responses of ``method`` for a batch of prompt ids, seeded by ``seed``."""
    config = settings.decode_config(method)
    kwargs = dict(
        eos_ids=eos_token_ids(tokenizer, base, rl),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        generator=torch.Generator(device=next(base.parameters()).device).manual_seed(seed),
    )
    if method in ("base", "rl"):
        return single_model_generate(
            base if method == "base" else rl,
            prompt_ids,
            temperature=config.temperature,
            top_p=config.top_p,
            max_new_tokens=config.max_new_tokens,
            **kwargs,
        )
    return two_model_generate(base, rl, prompt_ids, config, **kwargs)


def compare_methods(base, rl, tokenizer, benchmark, methods: Sequence[str], settings: RunSettings) -> dict:
    """Sample ``settings.k`` responses per problem of ``benchmark`` with each method, score them with the
    benchmark's reward and summarise (avg@k, pass@k, mean replacement ratio in percent).

    Returns ``{"metrics": {method: metrics}, "samples": [one dict per sample]}``.
    """
    from ..evaluation.runner import score_generations  # deferred: TRL (the eval runner imports it), for `generate` only

    rows = [benchmark.dataset[i] for i in range(len(benchmark.dataset))]
    jobs = [(i, j) for i in range(len(rows)) for j in range(settings.k)]  # (problem, sample)
    prompt_ids = [tokenize_prompt(tokenizer, row["prompt"]) for row in rows]
    eos = set(eos_token_ids(tokenizer, base, rl))
    metrics, samples = {}, []
    for method in methods:
        per_problem: list[list[dict]] = [[] for _ in rows]
        for start in range(0, len(jobs), settings.batch_size):
            batch = jobs[start : start + settings.batch_size]
            seed = derive_seed(settings.seed, benchmark.name, start)  # the same for every method
            out = generate(method, base, rl, tokenizer, [prompt_ids[i] for i, _ in batch], settings, seed)
            gens = [
                EvalGeneration(
                    text=tokenizer.decode(ids, skip_special_tokens=True),
                    num_tokens=len(ids),
                    truncated=not (ids and ids[-1] in eos),
                )
                for ids in out.responses
            ]
            scores = score_generations(benchmark, [rows[i] for i, _ in batch], [[g] for g in gens])
            for (i, j), g, [score], ratio in zip(batch, gens, scores, out.replacement_ratios):
                sample = {
                    "method": method,
                    "index": i,
                    "sample": j,
                    "prompt": render_prompt(tokenizer, rows[i]["prompt"]),
                    "completion": g.text,
                    "score": score,
                    "num_tokens": g.num_tokens,
                    "truncated": g.truncated,
                    "replacement_ratio": ratio,
                }
                per_problem[i].append(sample)
                samples.append(sample)
        metrics[method] = summarize(per_problem)
        metrics[method]["replaced_pct"] = 100 * sum(s["replacement_ratio"] for p in per_problem for s in p) / len(jobs)
    return {"metrics": metrics, "samples": samples}


def write_comparison(result: dict, settings: RunSettings, out_dir: str | Path) -> dict[str, Path]:
    """``results.json`` (settings + metrics), ``results.md`` (avg@k table) and ``samples.json`` in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: out_dir / name for name in ("results.json", "results.md", "samples.json")}
    files["results.json"].write_text(json.dumps({"settings": asdict(settings), "metrics": result["metrics"]}, indent=2))
    files["results.md"].write_text(markdown_table(result["metrics"], macro=False))
    files["samples.json"].write_text(json.dumps(result["samples"], indent=1, ensure_ascii=False))
    return files


def read_eval_samples(path: str | Path) -> tuple[list[str], list[str]]:
    """(prompts, completions) of every sample of an acpo-eval output (its folder or its ``samples.jsonl``)."""
    path = Path(path)
    if path.is_dir():
        path = path / SAMPLES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No acpo-eval samples at {path}: pass an acpo-eval --output_dir or its {SAMPLES_FILE}.")
    prompts, completions = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            pairs = [(record["prompt"], s["completion"]) for s in record["samples"]]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(
                f"{path}:{n} is not an acpo-eval record ({error!r}): expected JSON with `prompt` and `samples` "
                "(each with `completion`)."
            ) from None
        prompts.extend(p for p, _ in pairs)
        completions.extend(c for _, c in pairs)
    return prompts, completions


def sample_responses(model, base, rl, tokenizer, prompts: Sequence, settings: RunSettings) -> tuple[list, list]:
    """(prompt ids, response ids): ``settings.k`` responses per prompt sampled from ``model`` (``"base"``/``"rl"``)."""
    prompt_ids = [tokenize_prompt(tokenizer, p) for p in prompts for _ in range(settings.k)]
    responses = []
    for start in range(0, len(prompt_ids), settings.batch_size):
        batch = prompt_ids[start : start + settings.batch_size]
        responses += generate(model, base, rl, tokenizer, batch, settings, derive_seed(settings.seed, model, start)).responses
    return prompt_ids, responses


def score_and_analyse(base, rl, tokenizer, groups: dict, out_dir, *, batch_size=4, chunk_tokens=1024, top_k=None):
    """Score ``groups`` (source -> (prompt ids, response ids)) teacher-forced and write the analysis to ``out_dir``."""
    records = []
    for source, (prompt_ids, response_ids) in groups.items():
        scores = score_responses(
            base, rl, prompt_ids, response_ids, batch_size=batch_size, chunk_tokens=chunk_tokens, top_k=top_k
        )
        extra = [{"prompt_index": i} for i in range(len(prompt_ids))]
        records += records_from_scores(tokenizer, response_ids, scores, [source] * len(response_ids), extra)
    return write_analysis(records, out_dir)
