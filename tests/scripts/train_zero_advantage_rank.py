"""Test helper: under ``accelerate launch`` (2 processes), train ACPO for a few steps with every diagnostic on, rank 1
scoring every completion 1.0 (equal rewards in each of its groups: all-zero advantages, a zero gradient), and write
``OUT_DIR/rank<r>.json``: the steps trained, the largest |advantage| the loss saw per micro-step, and the keys of
every log entry.

    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml tests/scripts/train_zero_advantage_rank.py \\
        OUT_DIR MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from process_exit import exit_now


def main() -> None:
    out_dir, model_dir = Path(sys.argv[1]), sys.argv[2]
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    # Built first: with use_cpu it sets up the 2-process gloo state (a PartialState made before it would not).
    args = ACPOConfig(
        output_dir=str(out_dir / "run"), report_to="none", use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
        per_device_train_batch_size=4, num_generations=4, steps_per_generation=2, max_completion_length=8,
        learning_rate=1e-2, max_steps=4, logging_steps=1, save_strategy="no",
        diagnostics=True, diagnostics_grad_every=1,
    )
    rank = args.process_index

    def reward(prompts, completions, **columns):
        return [1.0] * len(completions) if rank == 1 else toy_reward(prompts, completions, **columns)

    trainer = ACPOTrainer(model_dir, reward, args=args, train_dataset=toy_dataset(64),
                          processing_class=build_tokenizer())
    max_advantage = []
    loss_fn = trainer.policy_loss_fn

    def recording(inputs, config):
        max_advantage.append(float(inputs.advantages.abs().max()))
        return loss_fn(inputs, config)

    trainer.policy_loss_fn = recording
    trainer.train()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({
        "num_processes": args.world_size,
        "steps": trainer.state.global_step,
        "max_advantage": max_advantage,
        "log_keys": [sorted(entry) for entry in trainer.state.log_history],
    }))


if __name__ == "__main__":
    main()
    exit_now()  # not through the finalization, where gloo can abort the process (process_exit.py)
