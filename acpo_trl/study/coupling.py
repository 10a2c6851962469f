"""What the coupled evaluation gains, measured on a grid's kept final models (docs/RESULTS.md, "The evaluation").

For pairs of variants paired by seed (``acpo:unclipped`` is ACPO alpha 3 against the unclipped update), the spread
over seeds (the SD) of the difference of their held-out avg@k, on the recipe's first ``limit`` held-out problems,
under three ways of drawing the samples:

    independent   the two models at different evaluation seeds (the run's seed, and the other's + 1000);
    per batch     today's report: the same seed, batches of 8 problems, torch's multinomial draw
                  (``acpo-eval --sampler multinomial --batch_size 8``, as the in-run evaluation draws them);
    coupled       the coupled sampler: the run's own final evaluation (``correct_per_problem`` in its result),
                  its first ``limit`` problems (the coupled sampler's samples of a problem do not depend on the others).

The first two are ``acpo-eval`` runs of each kept model (``<out>/models/<run_id>``), two at a time, resumable (their
samples under ``<out>/coupling/evals/``); ``coupling.json`` keeps every model's correct samples per problem under
each scheme and ``coupling.md`` the spreads, with a bootstrap interval (over seeds) of each scheme's SD relative to
per-batch seeding's. ``coupling.json`` is the measurement's store: a model whose counts it holds is not evaluated
again and counts after its weights are gone, so a grid that outlives the machine its models were kept on (they
are 0.5 GB each, not committed) is measured session by session, each session's models before it ends.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from .results import load_results
from .stats import shown

INDEPENDENT_OFFSET = 1000  # the second evaluation seed of a model: another draw, sharing no noise with the first
SCHEMES = ("independent", "per batch", "coupled")


def evaluation_jobs(results: list[dict], out_dir: Path, methods: set[str], limit: int,
                    stored: dict | None = None) -> list[dict]:
    """One ``acpo-eval`` job per kept model of ``methods`` and evaluation seed (the run's seed and seed + 1000),
    but those whose counts ``stored`` (the models of :func:`read_store`'s store) already holds."""
    jobs, stored = [], stored or {}
    for r in sorted(results, key=lambda r: r["run_id"]):
        spec = r["spec"]
        model = out_dir / "models" / r["run_id"]
        if spec["method"] not in methods or not model.is_dir():
            continue
        for seed in (spec["seed"], spec["seed"] + INDEPENDENT_OFFSET):
            if _eval_key(seed, spec["seed"]) in stored.get(r["run_id"], {}):
                continue
            jobs.append({"run_id": r["run_id"], "seed": seed, "model": str(model), "recipe": spec["recipe"],
                         "task": spec["task"], "output_dir": str(out_dir / "coupling" / "evals" / r["run_id"] /
                                                                   f"seed{seed}"),
                         "limit": limit})
    return jobs


def eval_command(job: dict) -> list[str]:
    """The ``acpo-eval`` command of a job: the model on its recipe's held-out set, as the in-run report samples
    (T = 1, k = 4, batches of 8, the multinomial sampler), at the job's seed."""
    from ..recipe import read_recipe  # deferred: the recipe parser imports TRL

    script_args, _, _ = read_recipe(job["recipe"])
    return [sys.executable, "-m", "acpo_trl.evaluation.cli", "--model_name_or_path", job["model"],
            "--recipe", job["recipe"], "--benchmarks", script_args.task, "--template", script_args.prompt_template,
            "--limit", str(job["limit"]), "--k", str(script_args.eval_k), "--seeds", str(job["seed"]),
            "--temperature", str(script_args.eval_temperature), "--sampler", "multinomial", "--batch_size", "8",
            "--backend", "transformers", "--dtype", "float32", "--output_dir", job["output_dir"]]


def run_evaluations(jobs: list[dict], parallel: int = 2, log=print) -> None:
    """Run the jobs without a finished ``results.json``, ``parallel`` at a time (one torch thread each)."""
    todo = [job for job in jobs if not (Path(job["output_dir"]) / "results.json").is_file()]
    log(f"{len(jobs)} evaluations, {len(jobs) - len(todo)} already done, {len(todo)} to run")
    running: list[tuple[subprocess.Popen, dict]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    while todo or running:
        while todo and len(running) < parallel:
            job = todo.pop(0)
            Path(job["output_dir"]).mkdir(parents=True, exist_ok=True)
            with open(Path(job["output_dir"]) / "log.txt", "w") as logfile:
                running.append((subprocess.Popen(eval_command(job), stdout=logfile, stderr=subprocess.STDOUT,
                                                 env=env), job))
        time.sleep(5)
        for process, job in list(running):
            if process.poll() is not None:
                running.remove((process, job))
                log(f"{job['run_id']} seed {job['seed']}: " + ("done" if process.returncode == 0 else
                                                                 f"FAILED ({job['output_dir']}/log.txt)"))


def correct_per_problem(output_dir: str | Path) -> list[int]:
    """The correct samples of each problem of an ``acpo-eval`` run (its ``results.json``), in problem order."""
    problems = json.loads((Path(output_dir) / "results.json").read_text())["problems"]
    return [sum(sample["score"] >= 1.0 for sample in problem["samples"]) for problem in problems]


EVALS = ("per batch", "second seed")  # a model's acpo-eval counts: at its run's seed, and at the other seed


def _eval_key(eval_seed: int, run_seed: int) -> str:
    return EVALS[eval_seed != run_seed]


def read_store(out_dir: Path, limit: int) -> dict:
    """``out_dir``'s ``coupling.json`` (``{"limit", "k", "models"}``; with no models when there is none); refused if
    it was measured on another number of problems (its counts would not pair with new ones)."""
    path = out_dir / "coupling.json"
    if not path.is_file():
        return {"limit": limit, "k": None, "models": {}}
    store = json.loads(path.read_text())
    if store["limit"] != limit:
        raise ValueError(f"{path} holds counts on {store['limit']} problems, not --limit {limit}: give --limit "
                         f"{store['limit']}, or move the file away to measure afresh")
    return store


def collect(results: list[dict], jobs: list[dict], limit: int, stored: dict | None = None) -> dict:
    """``{run_id: {"variant", "seed", "per batch": [...], "second seed": [...], "coupled": [...]}}``: each model's
    correct samples per problem, on the first ``limit`` problems, under each draw: ``stored``'s, with the jobs' added."""
    by_run = {r["run_id"]: r for r in results}
    models = {run_id: dict(entry) for run_id, entry in (stored or {}).items()}
    for job in jobs:
        r = by_run[job["run_id"]]
        entry = models.setdefault(job["run_id"], {"variant": r["variant"], "seed": r["spec"]["seed"],
                                                  "coupled": (r.get("correct") or {}).get("after", [])[:limit]})
        entry[_eval_key(job["seed"], r["spec"]["seed"])] = correct_per_problem(job["output_dir"])
    return models


def differences(models: dict, first: str, second: str, k: int) -> dict[str, dict[int, float]]:
    """Per scheme, ``{seed: avg@k(first's model) - avg@k(second's)}`` over the seeds both variants kept."""
    def avg(counts):
        return sum(counts) / (k * len(counts))

    runs = {(m["variant"], m["seed"]): m for m in models.values()}
    seeds = sorted({s for v, s in runs if v == first} & {s for v, s in runs if v == second})
    out = {scheme: {} for scheme in SCHEMES}
    for seed in seeds:
        a, b = runs[(first, seed)], runs[(second, seed)]
        out["independent"][seed] = avg(a["per batch"]) - avg(b["second seed"])
        out["per batch"][seed] = avg(a["per batch"]) - avg(b["per batch"])
        if a["coupled"] and b["coupled"]:
            out["coupled"][seed] = avg(a["coupled"]) - avg(b["coupled"])
    return out


def sd(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    center = sum(values) / len(values)
    return math.sqrt(sum((v - center) ** 2 for v in values) / (len(values) - 1))


def ratio_interval(a: dict[int, float], b: dict[int, float], resamples: int = 2000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of sd(a) / sd(b), resampling the seeds both hold (a fixed seed)."""
    seeds = sorted(a.keys() & b.keys())
    rng, ratios = random.Random(0), []
    for _ in range(resamples):
        drawn = rng.choices(seeds, k=len(seeds))
        top, bottom = sd([a[s] for s in drawn]), sd([b[s] for s in drawn])
        if bottom > 0 and math.isfinite(top):
            ratios.append(top / bottom)
    ratios.sort()
    if not ratios:
        return math.nan, math.nan
    return ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]


def spread_table(models: dict, pairs: list[tuple[str, str]], k: int) -> list[str]:
    """The spreads per pair and scheme, in points, with each scheme's SD relative to per-batch seeding's."""
    lines = ["| pair | seeds | scheme | mean difference | SD over seeds | SD / per-batch SD [95% bootstrap] |",
             "|---|---|---|---|---|---|"]
    for first, second in pairs:
        diffs = differences(models, first, second, k)
        base = diffs["per batch"]
        for scheme in SCHEMES:
            values = diffs[scheme]
            if not values:
                continue
            spread, base_spread = sd(list(values.values())), sd(list(base.values()))
            if not math.isfinite(base_spread):
                relative = "n/a (an SD needs 2 seeds)"
            elif scheme == "per batch":
                relative = "1"
            elif base_spread > 0:
                lo, hi = ratio_interval(values, base)
                relative = f"{spread / base_spread:.2f} [{lo:.2f}, {hi:.2f}]"
            else:
                relative = "n/a (the per-batch SD is 0)"
            difference = 100 * sum(values.values()) / len(values)
            lines.append(f"| `{first}` - `{second}` | {len(values)} | {scheme} | {difference:+.2f} | "
                         f"{shown(100 * spread, '.2f')} | {relative} |")
    return lines


def measure(out_dir: str | Path, pairs: list[tuple[str, str]], limit: int = 100, parallel: int = 2,
            log=print) -> str:
    """Evaluate the kept models of ``pairs`` (resumable), write ``coupling.json`` and ``coupling.md`` under
    ``out_dir``; returns the table."""
    out_dir = Path(out_dir)
    results = [r for r in load_results(out_dir) if (r.get("correct") or {}).get("after")]
    methods = {m for pair in pairs for m in pair}
    store = read_store(out_dir, limit)
    stored = store["models"]
    jobs = evaluation_jobs(results, out_dir, methods, limit, stored)
    if not jobs and not stored:
        raise ValueError(f"{out_dir}: no kept model of {sorted(methods)} (a grid keeps them under models/)")
    log(f"{sum(key in m for m in stored.values() for key in EVALS)} evaluations stored in {out_dir / 'coupling.json'}")
    run_evaluations(jobs, parallel, log)
    k = store["k"] or json.loads((Path(jobs[0]["output_dir"]) / "results.json").read_text())["settings"]["k"]
    models = collect(results, jobs, limit, stored)
    (out_dir / "coupling.json").write_text(json.dumps({"limit": limit, "k": k, "models": models}, indent=1))
    lines = ["# The coupled evaluation's gain", "",
             f"The first {limit} held-out problems x {k}; paired differences of final avg@{k} in points (study/"
             "coupling.py). independent: the two models at different evaluation seeds; per batch: the same seed, "
             "batches of 8 (today's report); coupled: the coupled sampler (the runs' own final evaluation).", "",
             *spread_table(models, pairs, k), ""]
    (out_dir / "coupling.md").write_text("\n".join(lines))
    return "\n".join(lines)
