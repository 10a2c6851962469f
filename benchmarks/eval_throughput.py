"""Evaluation throughput of the transformers backend on the offline model: one completion per ``generate`` call
against batched calls (``--batch_size`` problems x ``--k`` samples, left padding, KV cache), side by side.

    python benchmarks/eval_throughput.py [--problems 8] [--k 4] [--batch_size 8] [--max_tokens 128] [--threads 2]

Both modes sample the same prompts (the first ``--problems`` MATH500 problems, chat template) with the same
settings (T = 1.0, top-p = 1.0). A short warm-up call precedes the timing. Printed: completions/s, generated
tokens/s and the batched/unbatched ratio. The model is SmolLM2-135M-Instruct (``acpo_trl.utils.offline_model``).
"""

from __future__ import annotations

import argparse
import time

import torch

from acpo_trl.data.math import load_math_eval
from acpo_trl.evaluation.generation import SamplingSettings, TransformersBackend, tokenize_prompt
from acpo_trl.utils.offline_model import load_offline_model


def timed(backend, calls):
    """Run ``calls`` ((prompt_ids, num_samples, seed) tuples); return (seconds, completions, generated tokens)."""
    start = time.perf_counter()
    generations = [g for ids, n, seed in calls for per_prompt in backend.generate(ids, n, seed) for g in per_prompt]
    return time.perf_counter() - start, len(generations), sum(g.num_tokens for g in generations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--k", type=int, default=4, help="samples per problem")
    parser.add_argument("--batch_size", type=int, default=8, help="problems per batched generate call")
    parser.add_argument("--max_tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load_offline_model()
    backend = TransformersBackend(model, tokenizer, SamplingSettings(temperature=1.0, max_tokens=args.max_tokens))
    prompts = load_math_eval("math500", template="chat")["prompt"][: args.problems]
    ids = [tokenize_prompt(tokenizer, p) for p in prompts]
    backend.generate(ids[:2], 2, seed=-1)  # warm-up

    unbatched = [([one], 1, 1000 * i + j) for i, one in enumerate(ids) for j in range(args.k)]
    batched = [(ids[s : s + args.batch_size], args.k, s) for s in range(0, len(ids), args.batch_size)]
    rows = {"unbatched (1 completion/call)": timed(backend, unbatched)}
    rows[f"batched ({args.batch_size} problems x {args.k} samples/call)"] = timed(backend, batched)

    print(f"SmolLM2-135M-Instruct, {args.problems} MATH500 problems x {args.k} samples, T=1.0, max {args.max_tokens} "
          f"tokens, {args.threads} threads, device {model.device}")  # fmt: skip
    print(f"| mode | seconds | completions/s | tokens/s |\n|---|---:|---:|---:|")
    for name, (seconds, completions, tokens) in rows.items():
        print(f"| {name} | {seconds:.1f} | {completions / seconds:.2f} | {tokens / seconds:.0f} |")
    (t1, c1, _), (t2, c2, _) = rows.values()
    print(f"batched / unbatched completions per second: {(c2 / t2) / (c1 / t1):.1f}x")


if __name__ == "__main__":
    main()
