#!/bin/bash
# run.sh NAME acpo-train-args...: one pilot, one torch thread, its command, exit code and wall time in NAME.log
name=$1; shift
cd "$(git rev-parse --show-toplevel)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
echo "CMD: acpo-train $*" > outputs/pilots_long/$name.log
start=$(date +%s)
.venv/bin/acpo-train "$@" --output_dir outputs/pilots_long/$name >> outputs/pilots_long/$name.log 2>&1
echo "RC $? WALL $(( $(date +%s)-start )) s" >> outputs/pilots_long/$name.log
