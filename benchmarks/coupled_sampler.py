"""The coupled sampler's cost against the multinomial sampler, measured side by side on SmolLM2 with the running_sum
recipe's held-out set, through ``sample_benchmark`` (the path of ``acpo-eval`` and of the report's evaluation).

    python benchmarks/coupled_sampler.py --threads 1                      # 32 problems x 4, batches of 8
    python benchmarks/coupled_sampler.py --threads 1 --problems 500       # the 500 x 4 evaluation
    python benchmarks/coupled_sampler.py --threads 1 --problems 64 --batch_sizes 8 16 32 64 --samplers coupled

The model is the recipe's (``configs/study/smollm2_running_sum.yaml``: its warm-up checkpoint) when that folder
exists, else ``offline:smollm2`` with the recipe's prompts (timing only: the untrained model's completions differ
in length). Sampling as the recipe's report: ``eval_temperature``, top-p 1, ``max_completion_length`` tokens, ``--k``
samples per problem, seed 0. Each batch of problems is sampled by every sampler in turn (the first one rotating),
and every batch size in turn (the order rotating), chunk by chunk of problems, so that the other jobs of a shared
machine weigh on all of them alike.

Printed per (batch size, sampler): seconds, completions/s, decoding steps (the longest completion of each call),
seconds per step, avg@k; per batch size, the coupled/multinomial ratio of the total time and the median of the
per-batch ratios; whether the coupled samples are the same at every batch size; and the noise's own time per
step (``gumbel_noise`` on rows x vocabulary) beside the time of a decoding step.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

from acpo_trl.evaluation.benchmarks import Benchmark, load_benchmark
from acpo_trl.evaluation.coupled import gumbel_noise
from acpo_trl.evaluation.generation import SAMPLERS, SamplingSettings, TransformersBackend
from acpo_trl.evaluation.metrics import summarize
from acpo_trl.evaluation.runner import sample_benchmark
from acpo_trl.recipe import read_recipe, resolve_model_path

RECIPE = "configs/study/smollm2_running_sum.yaml"


def outside(start: int, size: int):
    """``sample_benchmark``'s ``skip`` for every problem but those of the batch ``[start, start + size)``."""
    return lambda key: not start <= key[1] < start + size


def sample_batches(benchmark: Benchmark, backends: dict, k: int, batch_sizes: list[int]) -> dict:
    """Per (batch size, sampler), one entry per batch (``seconds``, ``steps``, its ``records``): ``sample_benchmark``
    restricted to that batch by its ``skip``, so each call is the one a whole run makes. The problems go by chunks
    of the largest batch size; every (batch size, sampler) samples a chunk before the next one starts, in an order
    that rotates from chunk to chunk, so that a change in the machine's load weighs on all of them alike."""
    cells = [(size, sampler) for size in batch_sizes for sampler in backends]
    batches = {cell: [] for cell in cells}
    chunk = max(batch_sizes)
    for number, first in enumerate(range(0, len(benchmark.dataset), chunk)):
        for size, sampler in cells[number % len(cells):] + cells[:number % len(cells)]:
            for start in range(first, min(first + chunk, len(benchmark.dataset)), size):
                begin = time.perf_counter()
                records = sample_benchmark(benchmark, backends[sampler], k, [0], size, skip=outside(start, size),
                                           progress=False)
                seconds = time.perf_counter() - begin
                steps = max(s["num_tokens"] for r in records for s in r["samples"])
                batches[size, sampler].append({"seconds": seconds, "steps": steps, "records": records})
    return batches


def noise_ms(rows: int, vocab: int, repeats: int = 20) -> float:
    """Milliseconds of ``gumbel_noise`` for ``rows`` keys over ``vocab`` tokens, averaged over ``repeats`` steps."""
    keys = torch.arange(rows, dtype=torch.int64)
    gumbel_noise(keys, 0, vocab)
    start = time.perf_counter()
    for position in range(repeats):
        gumbel_noise(keys, position, vocab)
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--k", type=int, default=4, help="samples per problem")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[8], help="problems per generate call")
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    script_args, training_args, model_args = read_recipe(RECIPE)
    name = model_args.model_name_or_path if os.path.isdir(model_args.model_name_or_path) else "offline:smollm2"
    path = resolve_model_path(name)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)
    recipe = (dataclasses.replace(script_args, num_eval_tasks=args.problems), training_args.seed)
    benchmark = load_benchmark(script_args.task, script_args.prompt_template, recipe=recipe)
    backends = {s: TransformersBackend(model, tokenizer, SamplingSettings(
        script_args.eval_temperature, 1.0, training_args.max_completion_length, sampler=s)) for s in args.samplers}
    warm_up = Benchmark(benchmark.name, benchmark.dataset.select(range(2)), benchmark.reward_func)
    for backend in backends.values():
        sample_benchmark(warm_up, backend, 2, [0], 2, progress=False)

    load = os.getloadavg()[0]
    cells = sample_batches(benchmark, backends, args.k, args.batch_sizes)
    print(f"{name} ({model.config.architectures[0]}), {RECIPE} held-out set: {args.problems} problems x {args.k} "
          f"samples, T = {script_args.eval_temperature}, max {training_args.max_completion_length} tokens, "
          f"{args.threads} thread(s), {os.cpu_count()} CPUs, load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| batch size | sampler | seconds | completions/s | decoding steps | s/step | avg@k |\n"
          "|---:|---|---:|---:|---:|---:|---:|")
    step_seconds = {}
    for (batch_size, sampler), cell in cells.items():
        seconds, steps = sum(b["seconds"] for b in cell), sum(b["steps"] for b in cell)
        step_seconds[batch_size, sampler] = seconds / steps
        samples = [r["samples"] for b in cell for r in b["records"]]
        print(f"| {batch_size} | {sampler} | {seconds:.1f} | {args.problems * args.k / seconds:.2f} | {steps} | "
              f"{seconds / steps:.3f} | {summarize(samples)[f'avg@{args.k}']:.3f} |")
    for batch_size in args.batch_sizes if len(args.samplers) == 2 else []:
        coupled, multinomial = cells[batch_size, "coupled"], cells[batch_size, "multinomial"]
        total = sum(b["seconds"] for b in coupled) / sum(b["seconds"] for b in multinomial)
        per_batch = statistics.median(c["seconds"] / m["seconds"] for c, m in zip(coupled, multinomial))
        print(f"batch {batch_size}: coupled / multinomial time {total:.3f}x in total, {per_batch:.3f}x the median of "
              f"{len(coupled)} batches")
    if "coupled" in args.samplers and len(args.batch_sizes) > 1:
        samples = [sorted((r["index"], r["samples"]) for b in cells[size, "coupled"] for r in b["records"])
                   for size in args.batch_sizes]
        print(f"coupled samples identical at batch sizes {args.batch_sizes}: {all(s == samples[0] for s in samples)}")
    vocab = model.get_output_embeddings().weight.shape[0]
    for batch_size in args.batch_sizes:
        rows = batch_size * args.k
        steps = ", ".join(f"{s} {step_seconds[batch_size, s] * 1000:.0f} ms" for s in args.samplers)
        print(f"noise of one step, {rows} rows x {vocab} tokens: {noise_ms(rows, vocab):.1f} ms; a decoding step: {steps}")


if __name__ == "__main__":
    main()
