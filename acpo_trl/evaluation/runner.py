"""Evaluation runs: sample ``k`` completions per problem, score them with the benchmark's reward, report metrics.

``sample_benchmark`` is the core (also used by the in-training callback): problems are cut into fixed batches of
``batch_size``; each (batch, seed) pair is one generation call seeded by ``derive_seed(seed, benchmark, batch)``,
so the samples do not depend on which batches were already done (a resumed run equals an uninterrupted one). A
batch-invariant backend (the coupled sampler) is seeded by ``derive_seed(seed, benchmark)`` alone and keys its
noise by problem, so its samples do not depend on the batches at all.
``evaluate`` adds model loading, the resumable store and the output files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import trl.import_utils as trl_import_utils
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from ..recipe import read_recipe
from ..utils.cli_errors import MissingPackageError
from .benchmarks import Benchmark, load_benchmark, parse_benchmark
from .config import EvalConfig
from .generation import (TransformersBackend, VLLMBackend, derive_seed, load_model_and_tokenizer, render_prompt,
                         tokenize_prompt)
from .metrics import macro_average, summarize
from .report import markdown_table
from .store import SampleStore, record_key

logger = logging.getLogger(__name__)

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"


def _as_completion(prompt, text: str):
    """A completion in the prompt's format, as ``GRPOTrainer`` hands it to rewards."""
    return text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]


def score_generations(benchmark: Benchmark, rows: Sequence[dict], generations: Sequence[Sequence]) -> list[list[float]]:
    """Scores of ``generations[i][j]`` (sample j of dataset row ``rows[i]``) by the benchmark's reward, called
    once for the whole batch with every dataset column repeated per completion, as in training."""
    prompts, completions, columns = [], [], {}
    for row, samples in zip(rows, generations):
        for sample in samples:
            prompts.append(row["prompt"])
            completions.append(_as_completion(row["prompt"], sample.text))
            for key, value in row.items():
                if key != "prompt":
                    columns.setdefault(key, []).append(value)
    scores = benchmark.reward_func(prompts=prompts, completions=completions, **columns)
    if len(scores) != len(completions):
        raise ValueError(f"The {benchmark.name} reward returned {len(scores)} scores for {len(completions)} completions.")
    if None in scores:
        raise ValueError(
            f"The {benchmark.name} reward returned None (\"not applicable\") for some samples: the benchmark's data "
            "lacks what its reward needs (e.g. a gold answer). Check the benchmark file."
        )
    flat = iter(float(s) for s in scores)
    return [[next(flat) for _ in samples] for samples in generations]


def sample_benchmark(
    benchmark: Benchmark,
    backend,
    samples_per_seed: int,
    seeds: Sequence[int],
    batch_size: int,
    skip: Callable[[tuple[str, int, int]], bool] = lambda key: False,
    on_batch: Callable[[list[dict]], None] = lambda records: None,
    progress: bool = True,
) -> list[dict]:
    """Sample and score every problem of ``benchmark`` for every seed.

    Returns one record per (problem, seed): ``benchmark``, ``index``, ``seed``, ``prompt`` (rendered text) and
    ``samples`` (``completion``, ``score``, ``num_tokens``, ``truncated``). Batches whose every key
    ``(benchmark, index, seed)`` satisfies ``skip`` are not generated (nor returned); of the others, a
    batch-invariant backend (``backend.batch_invariant``) samples only the problems not skipped (a run resumed with
    another ``batch_size``). ``on_batch`` receives each new batch's records as soon as they are scored.
    """
    dataset = benchmark.dataset
    starts = range(0, len(dataset), batch_size)
    jobs = [(start, seed) for start in starts for seed in seeds]
    todo = [
        (start, seed)
        for start, seed in jobs
        if not all(skip((benchmark.name, i, seed)) for i in range(start, min(start + batch_size, len(dataset))))
    ]
    tokenizer = backend.tokenizer
    invariant = getattr(backend, "batch_invariant", False)  # duck-typed backends (tests' scripted ones) are not
    records = []
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=benchmark.name, unit="batch", disable=not progress)
    for start, seed in todo:
        indices = range(start, min(start + batch_size, len(dataset)))
        if invariant:
            indices = [i for i in indices if not skip((benchmark.name, i, seed))]
        rows = [dataset[i] for i in indices]
        prompt_ids = [tokenize_prompt(tokenizer, row["prompt"]) for row in rows]
        call_seed = derive_seed(seed, benchmark.name) if invariant else derive_seed(seed, benchmark.name, start)
        generations = backend.generate(prompt_ids, samples_per_seed, call_seed)
        scores = score_generations(benchmark, rows, generations)
        batch = [
            {
                "benchmark": benchmark.name,
                "index": i,
                "seed": seed,
                "prompt": render_prompt(tokenizer, row["prompt"]),
                "columns": {k: v for k, v in row.items() if k != "prompt"},
                "samples": [
                    {"completion": g.text, "score": s, "num_tokens": g.num_tokens, "truncated": g.truncated}
                    for g, s in zip(gens, sample_scores)
                ],
            }
            for i, row, gens, sample_scores in zip(indices, rows, generations, scores)
        ]
        on_batch(batch)
        records.extend(batch)
        bar.update(1)
    bar.close()
    return records


def group_problems(records: Iterable[dict], seeds: Sequence[int]) -> dict[str, list[dict]]:
    """Per benchmark, one entry per problem (in index order) with its samples of every seed (in ``seeds`` order,
    each sample tagged with its ``seed``). Problems missing a seed are left out."""
    by_key = {record_key(r): r for r in records}
    problems: dict[str, list[dict]] = {}
    for benchmark, index in sorted({(b, i) for b, i, _ in by_key}):
        parts = [by_key.get((benchmark, index, seed)) for seed in seeds]
        if None in parts:
            continue
        problems.setdefault(benchmark, []).append(
            {
                "benchmark": benchmark,
                "index": index,
                "prompt": parts[0]["prompt"],
                "columns": parts[0]["columns"],
                "samples": [{"seed": p["seed"], **s} for p in parts for s in p["samples"]],
            }
        )
    return problems


def compute_metrics(problems: dict[str, list[dict]], pass_k: Sequence[int] = ()) -> dict[str, dict]:
    """``metrics.summarize`` of each benchmark's problems."""
    return {name: summarize([p["samples"] for p in items], pass_k) for name, items in problems.items()}


def build_backend(config: EvalConfig):
    """The generation backend ``config`` asks for (``auto``: vLLM when installed and a GPU is present)."""
    is_vllm_available = trl_import_utils.is_vllm_available  # looked up per call: the tests stand in for it
    backend = config.backend
    if backend == "auto":
        vllm = is_vllm_available() and torch.cuda.is_available() and config.sampler == "multinomial"
        backend = "vllm" if vllm else "transformers"
    if backend == "vllm":
        if not is_vllm_available():
            raise MissingPackageError("vllm", "backend='vllm'", "use --backend transformers")
        tokenizer_source = config.model_name_or_path
        if config.adapter_path and (Path(config.adapter_path) / "tokenizer_config.json").is_file():
            tokenizer_source = config.adapter_path
        return VLLMBackend(
            config.model_name_or_path,
            AutoTokenizer.from_pretrained(tokenizer_source),
            config.sampling,
            adapter_path=config.adapter_path,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            seed=config.seeds[0],
            enforce_eager=config.enforce_eager,
        )
    model, tokenizer = load_model_and_tokenizer(config.model_name_or_path, config.adapter_path, config.dtype, config.device)
    return TransformersBackend(model, tokenizer, config.sampling)


def _run_settings(config: EvalConfig, backend_name: str, batch_size: int) -> dict:
    """The settings the samples depend on (a resumed run must match them); benchmarks and limit may change, and so
    may the batch size under the coupled sampler (recorded as None)."""
    return {
        "model_name_or_path": config.model_name_or_path,
        "adapter_path": config.adapter_path,
        "template": config.template,
        "recipe": config.recipe,
        "k": config.k,
        "seeds": config.seeds,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_tokens": config.max_tokens,
        "sampler": config.sampler,
        "backend": backend_name,
        "batch_size": None if config.sampler == "coupled" else batch_size,
        "dtype": config.dtype,
    }


def load_benchmarks(config: EvalConfig) -> list[Benchmark]:
    """The benchmarks ``config.benchmarks`` names, in its order; naming one twice is an error. With
    ``config.recipe``, the recipe's task is evaluated on the recipe's held-out set."""
    recipe = None
    if config.recipe is not None:
        script_args, training_args, _ = read_recipe(config.recipe)
        if script_args.task not in [parse_benchmark(spec)[0] for spec in config.benchmarks]:
            raise ValueError(f"EvalConfig.recipe={config.recipe!r} trains task {script_args.task!r}, which "
                             f"--benchmarks does not name: add `--benchmarks {script_args.task}`.")
        if script_args.prompt_template != config.template:
            raise ValueError(f"EvalConfig.template={config.template!r}: the recipe's prompts are "
                             f"{script_args.prompt_template!r}; give `--template {script_args.prompt_template}`.")
        recipe = (script_args, training_args.seed)
    benchmarks = [
        load_benchmark(spec, config.template, config.data_dir, config.hitab_tables_dir, config.limit, recipe)
        for spec in config.benchmarks
    ]
    names = [b.name for b in benchmarks]
    if len(set(names)) != len(names):
        raise ValueError(f"`benchmarks` names a benchmark twice: {config.benchmarks}.")
    return benchmarks


def evaluate(
    config: EvalConfig, backend=None, progress: bool = True, benchmarks: list[Benchmark] | None = None
) -> dict:
    """Run (or resume) the evaluation ``config`` describes and write ``results.json`` and ``results.md``.

    Args:
        config: the run's settings.
        backend: a ready generation backend (e.g. a ``TransformersBackend`` around an in-memory model); by default
            one is built from ``config``.
        progress: show progress bars.
        benchmarks: ``load_benchmarks(config)`` when the caller already loaded them (``acpo-eval`` does, to report
            a bad name or file before loading the model); by default they are loaded here.

    Returns:
        ``{"settings", "metrics": {benchmark: {...}}, "macro_average", "table"}``; ``results.json`` holds the same
        plus ``problems`` (every problem with its prompt, gold columns and samples).
    """
    benchmarks = load_benchmarks(config) if benchmarks is None else benchmarks
    names = [b.name for b in benchmarks]
    backend = backend or build_backend(config)
    batch_size = config.batch_size or (256 if backend.name == "vllm" else 8)
    settings = _run_settings(config, backend.name, batch_size)
    store = SampleStore(config.output_dir, settings, overwrite=config.overwrite)
    for benchmark in benchmarks:
        sample_benchmark(
            benchmark,
            backend,
            config.samples_per_seed,
            config.seeds,
            batch_size,
            skip=store.__contains__,
            on_batch=store.append,
            progress=progress,
        )
    wanted = {(b.name, i) for b in benchmarks for i in range(len(b.dataset))}
    records = [r for r in store.records.values() if (r["benchmark"], r["index"]) in wanted]
    problems = group_problems(records, config.seeds)
    metrics = compute_metrics({name: problems[name] for name in names}, config.pass_k or ())
    result = {
        "settings": {**settings, "benchmarks": config.benchmarks, "limit": config.limit},
        "metrics": metrics,
        "macro_average": macro_average(metrics),
        "table": markdown_table(metrics),
    }
    output_dir = Path(config.output_dir)
    full = {**result, "problems": [p for name in names for p in problems[name]]}
    (output_dir / RESULTS_JSON).write_text(json.dumps(full, indent=1, ensure_ascii=False, default=str) + "\n")
    (output_dir / RESULTS_MD).write_text(_markdown_report(config, result))
    return result


def _markdown_report(config: EvalConfig, result: dict) -> str:
    decoding = f"T={config.temperature}, top-p={config.top_p}, {config.sampler} sampler, max {config.max_tokens} tokens"
    seeds = f"{config.samples_per_seed} samples x seeds {config.seeds}"
    return (
        f"# Evaluation of `{config.model_name_or_path}`"
        + (f" + adapter `{config.adapter_path}`" if config.adapter_path else "")
        + f"\n\nk={config.k} ({seeds}), {decoding}, template `{config.template}`, backend "
        f"`{result['settings']['backend']}`.\n\n{result['table']}"
    )
