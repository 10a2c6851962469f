#!/bin/bash
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
while pgrep -f "outputs/pilots/run.sh w6x30_diag16" > /dev/null; do sleep 10; done
export PYTHONPATH=. OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
for c in w6x9v w6x30v; do
outputs/pilots/warm_multi.sh ${c}_warmup 8 --recipe outputs/pilots/$c.yaml --learning_rate 1e-5 --max_steps 16
outputs/pilots/screen.sh ${c}_l25 --limit 25 --config outputs/pilots/$c.yaml
python outputs/pilots/binscreen.py ${c}_l25 --config outputs/pilots/$c.yaml > outputs/pilots/${c}_l25.bins.json 2>/dev/null
done
