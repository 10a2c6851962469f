"""``acpo-demo``: a one-minute offline ACPO run of the tiny local model on the toy letter task (CPU).

Several optimizer updates per rollout (off-policy), so the per-bin clip ranges move away from the base after
the first update of each rollout; the script prints them at every step, then the reward before and after.
"""

from __future__ import annotations

import os
import warnings

from transformers import PrinterCallback, TrainerCallback

from acpo_trl.utils.cli_errors import ArgumentParser, cli_main
from acpo_trl.utils.number_checks import AT_LEAST_ONE, NON_NEGATIVE, argument
from acpo_trl.utils.tiny_models import build_tiny_model


class BinTableCallback(TrainerCallback):
    """Print, at every logging step, the rollout reward (when one was generated) and each bin's eps_b."""

    def __init__(self, num_bins: int):
        self.num_bins = num_bins
        self.rewards: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "policy_loss" not in logs:
            return
        if not self.rewards and "reward" in logs:
            edges = " ".join(f"[{b / self.num_bins:.1f},{(b + 1) / self.num_bins:.1f})" for b in range(self.num_bins))
            print(f"step  reward  clip range eps_b per probability bin {edges}   ('-' = empty bin)")
        reward = logs.get("reward")
        if reward is not None:
            self.rewards.append(reward)
        cells = [logs.get(f"acpo/bin{b}/eps") for b in range(self.num_bins)]
        row = "  ".join(f"{c:9.3f}" if c is not None else f"{'-':>9}" for c in cells)
        print(f"{state.global_step:4d}  {'' if reward is None else f'{reward:6.3f}':>6}  {row}")


@cli_main("acpo-demo")
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="acpo-demo", description=__doc__)
    parser.add_argument("--steps", type=argument(int, AT_LEAST_ONE), default=48, help="optimizer steps")
    parser.add_argument("--updates-per-rollout", type=argument(int, AT_LEAST_ONE), default=4,
                        help="steps_per_generation (off-policy degree)")
    parser.add_argument("--output-dir", default="outputs/acpo-demo-toy")
    parser.add_argument("--seed", type=argument(int, NON_NEGATIVE), default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames, not ours to fix

    # deferred: TRL (the trainer, and the task registry's ScriptArguments), after the flags are parsed
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = build_tiny_model(seed=args.seed)
    config = ACPOConfig(
        output_dir=args.output_dir,
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=16,
        num_generations=8,
        steps_per_generation=args.updates_per_rollout,
        max_completion_length=12,
        learning_rate=1e-2,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
        disable_tqdm=True,
    )
    table = BinTableCallback(config.acpo_num_bins)
    trainer = ACPOTrainer(
        model, toy_reward, args=config, train_dataset=toy_dataset(256, seed=args.seed), processing_class=tokenizer,
        callbacks=[table],
    )
    trainer.remove_callback(PrinterCallback)  # the table replaces the raw log dicts
    print(
        f"ACPO demo: tiny Qwen2 on the toy letter task, {config.updates_per_rollout:g} optimizer updates per rollout, "
        f"K={config.acpo_num_bins}, alpha={config.acpo_alpha}, base={config.epsilon}"
    )
    trainer.train()
    print(f"mean reward: first rollout {table.rewards[0]:.3f} -> last rollout {table.rewards[-1]:.3f}")


if __name__ == "__main__":
    main()
