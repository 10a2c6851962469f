"""A short supervised warm-up on a task's worked solutions: the checkpoint every RL run of a recipe starts from.

    acpo-warmup --recipe configs/study/smollm2_running_sum.yaml

Reads the task from the RL recipe (``task`` and its fields, parsed by ``acpo-train``'s own parser), trains
``base_model`` with TRL's ``SFTTrainer`` on ``num_examples`` generated problems (the task's own prompt, its worked
answer as the assistant's turn, the loss on the answer only) for ``max_steps`` steps of ``batch_size`` at a constant
``learning_rate``, and saves the model and its tokenizer where the recipe's ``model_name_or_path`` points, with
``warmup.json`` (the settings, the data's seed, the loss per step). The warm-up problems exclude the held-out
problems of every run seed below ``exclude_seeds``, so no run is evaluated on a problem its start was trained on.

Only a task that registers worked solutions (``TaskSpec.worked_solutions``) has warm-up data: ``running_sum``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch
from transformers import AutoTokenizer
from trl import TrlParser

from .recipe import read_recipe, resolve_model_path
from .tasks import get_task, registered
from .utils.cli_errors import UserError, cli_main, parse_config
from .utils.number_checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check_numbers
from .utils.run_folder import claimed

RANGES = {"num_examples": AT_LEAST_ONE, "max_steps": AT_LEAST_ONE, "batch_size": AT_LEAST_ONE,
          "learning_rate": POSITIVE, "exclude_seeds": NON_NEGATIVE}  # checked at construction
WARMUP_SEED_OFFSET = 20_000  # the warm-up problems' seed: neither a run's training (seed) nor held-out (seed + 10_000)


@dataclass
class WarmupArguments:
    """Settings of ``acpo-warmup`` (each a flag).

    Parameters:
        recipe (`str`): the RL recipe (an ``acpo-train`` YAML) whose task the warm-up teaches; the checkpoint goes to
            its ``model_name_or_path``.
        base_model (`str`, defaults to `"offline:smollm2"`): the model the warm-up starts from.
        num_examples (`int`, defaults to `512`): generated problems (distinct) with their worked answers.
        max_steps (`int`, defaults to `64`): optimizer steps (one pass over the examples at the defaults).
        batch_size (`int`, defaults to `8`): examples per step.
        learning_rate (`float`, defaults to `5e-5`): constant, AdamW (weight decay 0.01), no warm-up of the lr.
        seed (`int`, defaults to `0`): the data (drawn with ``seed + 20_000``), their order and the initialisation.
        exclude_seeds (`int`, defaults to `32`): the warm-up problems avoid the held-out problems of runs with seeds
            ``0..exclude_seeds - 1``.
    """

    recipe: str = field(metadata={"help": "The RL recipe whose task to teach (the checkpoint: its model_name_or_path)."})
    base_model: str = field(default="offline:smollm2", metadata={"help": "The model the warm-up starts from."})
    num_examples: int = field(default=512, metadata={"help": "Generated problems with their worked answers."})
    max_steps: int = field(default=64, metadata={"help": "Optimizer steps."})
    batch_size: int = field(default=8, metadata={"help": "Examples per optimizer step."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Constant learning rate (AdamW)."})
    seed: int = field(default=0, metadata={"help": "Seed of the data, their order and the run."})
    exclude_seeds: int = field(default=32, metadata={"help": "Avoid the held-out problems of run seeds below this."})

    def __post_init__(self):
        check_numbers(self, RANGES)


def warmup_dataset(script_args, args: WarmupArguments):
    """The prompt-completion rows of the warm-up of ``script_args.task`` (its registered worked solutions)."""
    worked = get_task(script_args.task).worked_solutions
    if worked is None:
        raise UserError(f"task {script_args.task!r} has no worked solutions to warm up on",
                        f"use one of {sorted(n for n, spec in registered().items() if spec.worked_solutions)}")
    return worked(script_args, args.num_examples, args.seed + WARMUP_SEED_OFFSET, args.exclude_seeds)


def run(args: WarmupArguments, callbacks=None) -> str:
    """Train the warm-up and save it where the recipe's ``model_name_or_path`` points; returns that folder.
    ``callbacks``: extra ``TrainerCallback`` objects (e.g. one that saves checkpoints along the way, for pilots)."""
    from trl import SFTConfig, SFTTrainer  # deferred: TRL's SFT trainer and the datasets library, for a run only

    script_args, _, model_args = read_recipe(args.recipe)
    output_dir = model_args.model_name_or_path
    if output_dir == args.base_model or output_dir.startswith("offline:"):
        raise UserError(f"--recipe {args.recipe}: its model_name_or_path is {output_dir!r}, not a warm-up folder",
                        "point it to the folder the warm-up writes, e.g. outputs/warmup/<recipe name>")
    with claimed(output_dir, "acpo-warmup", field=f"model_name_or_path of --recipe {args.recipe}"):
        base = resolve_model_path(args.base_model)
        dataset = warmup_dataset(script_args, args)
        config = SFTConfig(
            output_dir=os.path.join(output_dir, "sft"),
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.01,
            max_grad_norm=1.0,
            seed=args.seed,
            max_length=None,
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            model_init_kwargs={"dtype": torch.float32},
            logging_steps=1,
            save_strategy="no",
            save_only_model=True,
            report_to="none",
            disable_tqdm=True,
        )
        trainer = SFTTrainer(model=base, args=config, train_dataset=dataset,
                             processing_class=AutoTokenizer.from_pretrained(base), callbacks=callbacks)
        trainer.train()
        trainer.save_model(output_dir)
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        with open(os.path.join(output_dir, "warmup.json"), "w") as f:
            json.dump({**asdict(args), "task": script_args.task, "num_rows": len(dataset), "loss": losses}, f, indent=1)
        print(f"warm-up: {args.max_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved to {output_dir}")
    return output_dir


@cli_main("acpo-warmup")
def main(argv: list[str] | None = None) -> None:
    (args,) = parse_config(TrlParser(WarmupArguments, prog="acpo-warmup"), argv)
    run(args)


if __name__ == "__main__":
    main()
