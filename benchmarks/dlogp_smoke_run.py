"""Smoke run of the Δlog p toolkit end to end: SmolLM2-135M-Instruct (offline) against a briefly fine-tuned copy.

1. The copy gets a few plain SGD steps on single-digit additions answered "a + b = N. The answer is \\boxed{N}."
   (chat template, the Δlog p paper's instruction) — a stand-in for an RL checkpoint that fixed a behaviour.
2. ``acpo-dlogp generate`` compares, on held-out additions (a math500-layout file, scored by the project's math
   reward): each model alone, selective replacement (Δlog p ≤ τ) and selective extrapolation (γ).
3. ``acpo-dlogp score`` writes the per-token analysis (histograms, summary, top tokens) of both models' samples.

    python benchmarks/dlogp_smoke_run.py --out_dir /tmp/dlogp_smoke

Prints the avg@k / replacement-ratio table and the Δlog p summary. The figures are a smoke test, not a finding.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path

import torch

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def additions(seed: int, n: int, exclude=()) -> list[tuple[int, int]]:
    pairs = [(a, b) for a in range(10) for b in range(10) if (a, b) not in set(exclude)]
    return random.Random(seed).sample(pairs, n)


def fine_tune(model, tokenizer, pairs, steps: int, lr: float):
    """A copy of ``model`` after ``steps`` full-batch SGD steps (loss on the answer tokens, grad-norm clip 1)."""
    tuned = copy.deepcopy(model).train()
    rows = []
    for a, b in pairs:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?\n{INSTRUCTION}"}], add_generation_prompt=True,
            tokenize=True, return_dict=True,
        )["input_ids"]  # fmt: skip
        answer = tokenizer(f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.", add_special_tokens=False)
        rows.append((list(prompt), answer["input_ids"] + [tokenizer.eos_token_id]))
    width = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full_like(input_ids, -100)
    mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(rows):
        input_ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
        mask[i, : len(p) + len(r)] = 1
    optimizer = torch.optim.SGD(tuned.parameters(), lr=lr)
    for step in range(steps):
        loss = tuned(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tuned.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        print(f"fine-tune step {step}: loss {loss.item():.3f}", flush=True)
    return tuned.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--train", type=int, default=8)
    parser.add_argument("--test", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-2)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--tau", type=float, default=-0.3)
    parser.add_argument("--gamma", type=float, default=0.1)
    args = parser.parse_args()

    from acpo_trl.dlogp.cli import main as dlogp
    from acpo_trl.utils.offline_model import load_offline_model, offline_model_path

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base, tokenizer = load_offline_model()
    train = additions(0, args.train)
    test = additions(1, args.test, exclude=train)
    tuned = fine_tune(base, tokenizer, train, args.steps, args.lr)
    tuned.save_pretrained(out / "tuned")
    tokenizer.save_pretrained(out / "tuned")
    data = out / "additions.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n" for a, b in test))

    common = ["--base", offline_model_path(), "--rl", str(out / "tuned"), "--benchmark", f"math500={data}",
              "--template", "chat", "--k", str(args.k), "--max_new_tokens", str(args.max_new_tokens),
              "--batch_size", "16", "--device", "cpu"]  # fmt: skip
    dlogp(["generate", *common, "--methods", "base", "rl", "replace", "extrapolate", "--tau", str(args.tau),
           "--gamma", str(args.gamma), "--out_dir", str(out / "generate")])  # fmt: skip
    dlogp(["score", *common, "--k", "1", "--out_dir", str(out / "score")])
    summary = json.loads((out / "score" / "summary.json").read_text())
    for source, metrics in summary.items():
        print(source, "-generated dlogp:", json.dumps({k: round(v, 3) for k, v in metrics["dlogp"].items()}))


if __name__ == "__main__":
    main()
