"""Train with ACPO (or a baseline) from a YAML recipe: the same code as the ``acpo-train`` command.

    accelerate launch --config_file configs/accelerate/single_gpu.yaml examples/train_acpo.py \
        --config configs/countdown/qwen2.5-3b_acpo_off_policy.yaml
"""

from acpo_trl.train import main

if __name__ == "__main__":
    main()
