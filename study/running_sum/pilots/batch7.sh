#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
for c in w6x30 w8x9; do
outputs/pilots/run.sh ${c}_diag16 --config outputs/pilots/$c.yaml --report true --report_before_file outputs/pilots/before/${c}_seed0.json --diagnostics true --diagnostics_grad_every 0 --steps_per_generation 16 --per_device_train_batch_size 4 --max_steps 32 --learning_rate 1e-6
done
