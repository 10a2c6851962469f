"""``acpo-train``: train a causal LM with ACPO (or a baseline) on a task of this package, from a YAML recipe.

    acpo-train --config configs/demo.yaml
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml examples/train_acpo.py \\
        --config configs/math/qwen2.5-7b_acpo_off_policy.yaml

Arguments are TRL's: ``ACPOScriptArguments`` (task, data, report), ``ACPOConfig`` (every GRPOConfig field plus
the policy loss) and ``ModelConfig`` (model, dtype, LoRA via ``use_peft``), from the YAML file and/or the
command line (``acpo_trl/recipe.py``). The run itself is ``acpo_trl.run.run``; this application adds its command
line, the output folder held for the run, and a checkpoint when a scheduler stops it.
"""

from __future__ import annotations

import os
import sys
import warnings

from .recipe import make_parser
from .run import check_inputs, run
from .training.host_memory import cap_mmap_threshold
from .training.preemption import StopOnSignal
from .utils.cli_errors import cli_main, parse_config
from .utils.run_folder import claimed


@cli_main("acpo-train")
def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames, not ours to fix
    script_args, training_args, model_args = parse_config(make_parser(), argv)
    check_inputs(script_args, training_args, model_args)
    if training_args.use_cpu and script_args.low_memory:  # the tensors live in the C heap (acpo_trl/training/host_memory.py)
        cap_mmap_threshold()
    # The folder is this run's until it ends; a scheduler's SIGTERM or SIGUSR1 stops it with a checkpoint.
    with claimed(training_args.output_dir, "acpo-train", state=training_args.distributed_state), \
            StopOnSignal("acpo-train", sys.argv[1:] if argv is None else argv, training_args) as stop:
        trainer = run(script_args, training_args, model_args, stop=stop)
    # The script's end: destroy the process group, as PyTorch asks of a training script (without it, NCCL warns at
    # every exit that the group was not destroyed; on gloo see docs/recipes.md, "Multi-node").
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
