#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
while pgrep -f "outputs/pilots/batch5.sh" > /dev/null; do sleep 10; done
outputs/pilots/warm.sh w6x30_warmup --recipe outputs/pilots/w6x30.yaml --learning_rate 1e-5 --max_steps 16
outputs/pilots/screen.sh w6x30_l25 --limit 25 --config outputs/pilots/w6x30.yaml
outputs/pilots/warm.sh w8x9_warmup --recipe outputs/pilots/w8x9.yaml --learning_rate 1e-5 --max_steps 16
outputs/pilots/screen.sh w8x9_l25 --limit 25 --config outputs/pilots/w8x9.yaml
