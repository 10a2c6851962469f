#!/bin/bash
name=$1; shift
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
export PYTHONPATH=. OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
echo "CMD: screen $*" > outputs/pilots/$name.log
start=$(date +%s)
python outputs/pilots/screen.py $name "$@" >> outputs/pilots/$name.log 2>&1
echo "RC $? WALL $(( $(date +%s)-start )) s" >> outputs/pilots/$name.log
