"""Two-model decoding speed: time per generated token of ``two_model_generate`` (base + RL model, two KV caches,
Δlog p selection and π_Extra^γ sampling) against one-model sampling of the same length, measured side by side.

Target: at most 2.2x the single-model time per token. Both loops run the same number of steps (no EOS),
interleaved over ``--repeats`` rounds; the median per-token time of each is reported. The RL model is the base with
its weights perturbed, so that some positions are selected. ``transformers`` ``generate`` of the same length is
printed as a second reference.

    python benchmarks/two_model_decode.py                  # offline SmolLM2-135M-Instruct
    python benchmarks/two_model_decode.py --model tiny     # the 2-layer toy model (overhead-dominated)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from acpo_trl.dlogp import DecodeConfig, single_model_generate, two_model_generate


def load(name: str):
    if name == "tiny":
        from acpo_trl.utils.tiny_models import build_tiny_model

        return build_tiny_model(seed=0)
    from acpo_trl.utils.offline_model import load_offline_model

    return load_offline_model()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="offline", choices=("offline", "tiny"))
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gamma", type=float, default=0.1)
    parser.add_argument("--tau", type=float, default=-0.3)
    parser.add_argument("--noise", type=float, default=0.05, help="RL model = base + noise * std(w) * N(0, 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base, tokenizer = load(args.model)
    base.eval()
    rl = copy.deepcopy(base)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in rl.parameters():
            p.add_(args.noise * p.std() * torch.randn(p.shape, generator=generator))
    text = "Question: A train travels 60 km in 45 minutes. What is its average speed in km/h?\nAnswer:"
    prompts = [tokenizer(text)["input_ids"]] * args.batch_size
    common = dict(eos_ids=[], pad_token_id=tokenizer.pad_token_id or 0)  # no EOS: every row runs all steps
    config = DecodeConfig(criterion="dlogp", tau=args.tau, gamma=args.gamma, top_p=0.7, max_new_tokens=args.new_tokens)
    input_ids = torch.tensor(prompts)

    def single():
        gen = torch.Generator().manual_seed(0)
        return single_model_generate(base, prompts, top_p=0.7, max_new_tokens=args.new_tokens, generator=gen, **common)

    def two():
        return two_model_generate(base, rl, prompts, config, generator=torch.Generator().manual_seed(0), **common)

    def hf():
        with torch.inference_mode():
            base.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=True,
                top_p=0.7,
                top_k=0,
                min_new_tokens=args.new_tokens,
                max_new_tokens=args.new_tokens,
            )

    runs = {"single-model (same loop)": single, "two-model (dlogp, extrapolate)": two, "transformers generate": hf}
    for fn in runs.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    ratios = []
    for round_ in range(args.repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - start)
            print(f"round {round_}: {name}: {times[name][-1]:.2f} s", flush=True)
            if name.startswith("two"):
                ratios.append(sum(map(sum, out.selected)) / sum(map(len, out.selected)))
    tokens = args.batch_size * args.new_tokens
    per_token = {name: statistics.median(ts) / tokens for name, ts in times.items()}
    single_time = per_token["single-model (same loop)"]
    print(f"model={args.model} batch={args.batch_size} new_tokens={args.new_tokens} repeats={args.repeats} "
          f"threads={torch.get_num_threads()} replacement_ratio={statistics.mean(ratios):.3f}")  # fmt: skip
    print(f"{'decoding':34s} {'ms/token':>9s} {'tokens/s':>9s} {'x single':>9s}")
    for name, t in per_token.items():
        print(f"{name:34s} {1000 * t:9.2f} {1 / t:9.1f} {t / single_time:9.2f}")
    ratio = per_token["two-model (dlogp, extrapolate)"] / single_time
    print(f"two-model / single-model time per token: {ratio:.2f}x (target <= 2.2x): {'OK' if ratio <= 2.2 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
