#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
C=configs/study/smollm2_running_sum.yaml
outputs/pilots/screen.sh rs6x9s4_l25 --limit 25 --config $C --running_sum_shots 4
outputs/pilots/screen.sh rs6x3s2_l25 --limit 25 --config $C --running_sum_max_term 3
outputs/pilots/screen.sh rs6x5s4_l25 --limit 25 --config $C --running_sum_max_term 5 --running_sum_shots 4
outputs/pilots/screen.sh rs8x3s4_l25 --limit 25 --config $C --running_sum_terms 8 --running_sum_max_term 3 --running_sum_shots 4
