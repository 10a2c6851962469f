"""Bin shares of a screen's sampled completions under the model that sampled them (ACPO's bins at update k = 0).
usage: binscreen.py NAME acpo-train-args...  (the screen's own args, without --limit)"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from acpo_trl.train import make_parser, resolve_model_path
from acpo_trl.tasks import build_task
from acpo_trl.evaluation.generation import tokenize_prompt
name = sys.argv[1]
script, targs, margs = make_parser().parse_args_and_config(args=sys.argv[2:])
path = resolve_model_path(margs.model_name_or_path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(path)
ds = build_task(script, seed=targs.seed).eval_dataset
recs = [json.loads(l) for l in open(f"outputs/pilots/{name}.samples.jsonl")]
counts = [0] * 5; per = []
eos = tok.eos_token_id
with torch.inference_mode():
    for i, r in enumerate(recs):
        p_ids = tokenize_prompt(tok, ds[i]["prompt"])
        for s in r["samples"]:
            c_ids = tok(s["completion"], add_special_tokens=False)["input_ids"]
            if not s["truncated"]:
                c_ids = c_ids + [eos]
            ids = torch.tensor([p_ids + c_ids])
            logits = model(ids).logits[0, len(p_ids) - 1 : -1].float()
            probs = torch.softmax(logits, -1).gather(1, torch.tensor(c_ids)[:, None])[:, 0]
            b = torch.clamp((probs * 5).floor().long(), max=4)
            bc = torch.bincount(b, minlength=5).tolist()
            counts = [x + y for x, y in zip(counts, bc)]
            per.append(sum(bc[:4]))
tot = sum(counts)
print(json.dumps({"shares": [round(c / tot, 4) for c in counts], "bins03_per_completion": round(sum(per) / len(per), 2),
                  "tokens_per_completion": round(tot / len(per), 2)}))
