#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
while pgrep -f "outputs/pilots/batch1.sh" > /dev/null; do sleep 10; done
C=configs/study/smollm2_running_sum.yaml
outputs/pilots/screen.sh rw5x9s2_l25 --limit 25 --config $C --running_sum_style rewrite --running_sum_terms 5
outputs/pilots/screen.sh rw6x9s2_l25 --limit 25 --config $C --running_sum_style rewrite --running_sum_terms 6 --max_completion_length 128
outputs/pilots/screen.sh rw5x5s2_l25 --limit 25 --config $C --running_sum_style rewrite --running_sum_terms 5 --running_sum_max_term 5
