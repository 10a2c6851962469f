"""Start numbers of a recipe's held-out set without training (as acpo-train --report's before evaluation), samples dumped.
usage: screen.py NAME [--limit N] acpo-train-args..."""
import json, sys, time
name = sys.argv[1]; argv = sys.argv[2:]
limit = None
if argv[:1] == ["--limit"]:
    limit = int(argv[1]); argv = argv[2:]
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from acpo_trl.train import make_parser, resolve_model_path
from acpo_trl.tasks import build_task
from acpo_trl.evaluation.benchmarks import Benchmark
from acpo_trl.evaluation.generation import SamplingSettings, TransformersBackend
from acpo_trl.evaluation.runner import sample_benchmark
from acpo_trl.evaluation.metrics import summarize
script, targs, margs = make_parser().parse_args_and_config(args=argv)
path = resolve_model_path(margs.model_name_or_path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(path)
task = build_task(script, seed=targs.seed)
ds = task.eval_dataset if limit is None else task.eval_dataset.select(range(limit))
backend = TransformersBackend(model, tok, SamplingSettings(temperature=script.eval_temperature, max_tokens=targs.max_completion_length))
t0 = time.time()
records = sample_benchmark(Benchmark(script.task, ds, task.reward_funcs[0]), backend, script.eval_k, [targs.seed], 8, progress=False)
wall = time.time() - t0
m = summarize([r["samples"] for r in records])
m["eval_wall_s"] = round(wall, 1)
print(json.dumps(m))
with open(f"outputs/pilots/{name}.samples.jsonl", "w") as f:
    for r in records:
        f.write(json.dumps({"answer": r["columns"]["answer"], "samples": r["samples"]}) + "\n")
with open(f"outputs/pilots/{name}.screen.json", "w") as f:
    json.dump({"argv": argv, "limit": limit, **m}, f, indent=1)
