#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
export PYTHONPATH=. OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
C=outputs/pilots/w6x9v64.yaml
outputs/pilots/warm_multi.sh w6x9v64_warmup 32,48 --recipe $C --learning_rate 1e-5 --max_steps 64
for s in 32 48; do
outputs/pilots/screen.sh w6x9v_s${s}_l25 --limit 25 --config $C --model_name_or_path outputs/warmup/w6x9v64/sft/checkpoint-$s
python outputs/pilots/binscreen.py w6x9v_s${s}_l25 --config $C --model_name_or_path outputs/warmup/w6x9v64/sft/checkpoint-$s > outputs/pilots/w6x9v_s${s}_l25.bins.json 2>/dev/null
done
outputs/pilots/screen.sh w6x9v_s64_l25 --limit 25 --config $C
python outputs/pilots/binscreen.py w6x9v_s64_l25 --config $C > outputs/pilots/w6x9v_s64_l25.bins.json 2>/dev/null
