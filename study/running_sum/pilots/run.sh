#!/bin/bash
# usage: run.sh NAME args...   (runs acpo_trl.train with 1 thread, timed, logs to outputs/pilots/NAME.log)
name=$1; shift
cd "$(dirname "$0")/../.."  # the worktree root (the scripts sat in outputs/pilots/)
export PYTHONPATH=. OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
echo "CMD: acpo-train $*" > outputs/pilots/$name.log
start=$(date +%s)
python -m acpo_trl.train "$@" --output_dir outputs/pilots/$name --save_final_model false >> outputs/pilots/$name.log 2>&1
rc=$?
end=$(date +%s)
echo "RC $rc WALL $((end-start)) s" >> outputs/pilots/$name.log
