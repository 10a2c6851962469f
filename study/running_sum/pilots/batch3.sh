#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
while pgrep -f "outputs/pilots/batch2.sh" > /dev/null; do sleep 10; done
C=configs/study/smollm2_running_sum.yaml
outputs/pilots/screen.sh rs6x3s6_l25 --limit 25 --config $C --running_sum_max_term 3 --running_sum_shots 6
outputs/pilots/screen.sh rs6x2s4_l25 --limit 25 --config $C --running_sum_max_term 2 --running_sum_shots 4
