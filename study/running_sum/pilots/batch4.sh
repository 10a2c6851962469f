#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
while pgrep -f "outputs/pilots/batch3.sh" > /dev/null; do sleep 10; done
C=configs/study/smollm2_running_sum.yaml
outputs/pilots/screen.sh rsu6x9s4_l25 --limit 25 --config $C --running_sum_unique true --running_sum_shots 4
outputs/pilots/screen.sh rsu6x9s8_l25 --limit 25 --config $C --running_sum_unique true --running_sum_shots 8
