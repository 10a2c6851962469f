#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
while pgrep -f "warm_multi.py 4,8,16" > /dev/null; do sleep 10; done
C=outputs/pilots/w6x9.yaml
for s in 8 16 4; do
outputs/pilots/screen.sh w6x9_lr1e-5_s${s}_l25 --limit 25 --config $C --model_name_or_path outputs/warmup/w6x9/sft/checkpoint-$s
done
outputs/pilots/screen.sh w6x9_lr1e-5_s32_l25 --limit 25 --config $C
