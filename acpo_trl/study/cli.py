"""``acpo-study``: the ACPO study grid, on the CPU testbed or through a recipe (``acpo_trl.study.cli:main``).

    acpo-study run --out study/          the committed grid (both tasks, every registered method, upr 2/8/16,
                                         8 seeds, ACPO alpha sweep 0.5/1/3), 2 runs at a time, resumable
    acpo-study run --quick --out DIR     the test suite's tiny grid (seconds)
    acpo-study run --pilot --out DIR     1 seed of a few cells at the full settings (learning check, timing)
    acpo-study run --drift               the drift grid, into study/drift/: add2 x 3 drift levels (the testbed's
                                         learning rate, from the committed grid's to one matched to a real LM) x
                                         ACPO (paper, authors' defaults), acpo_log, DAPO, CISPO x upr 2/16 x 8
                                         seeds (`--levels between`: one level)
    acpo-study run --real-model          the real-model grid, into study/smollm2/: SmolLM2-135M-Instruct (offline) on
                                         the demo's addition task x 2 drift levels (lr 2e-5, 1e-6) x ACPO (paper,
                                         authors' defaults), DAPO, CISPO x upr 2/16 at 64 completions per rollout x
                                         8 seeds, level a first (`--levels a`: one level)
    acpo-study run --ablation            why ACPO wins, into study/smollm2/: at the real-model grid's level b, a wider
                                         fixed clip (H1), ACPO's mean ranges frozen per bin (H2) and a 1-bin ACPO
                                         (H3) x 16 seeds at upr 16 (ACPO alpha 3 and DAPO extended to them) and
                                         8 seeds at upr 2, reusing the committed cells
    acpo-study run --guard               the drift guard with its token rule, into study/smollm2/: ACPO alpha 3 and
                                         DAPO at upr 16 x 8 seeds, paired with the committed unguarded cells:
                                         ratio_std at 0.3 at level b, then level a, then kl at level a
                                         (`--levels b`, `--measures ratio_std`: fewer)
    acpo-study run --second-task         the second task, into study/smollm2/: SmolLM2 on single-digit multiplication
                                         at lr 1e-6 x ACPO (paper, authors' defaults), DAPO, CISPO and the ablation's
                                         variants that matched ACPO alpha 3 x upr 2/16 x 8 seeds (after the ablation)
    acpo-study run --long-task           where bins can matter, into study/running_sum/: SmolLM2 on running sums
                                         worked step by step (~65 tokens) at lr 1e-6, 8 rollouts of 64: ACPO alpha 3,
                                         DAPO, the wide fixed clip, DCPO, the frozen bin-wise clip at upr 16 and
                                         ACPO alpha 3 at upr 2 (DAPO there where its clip could bind)
    acpo-study run --alternatives        against what a TRL user would otherwise pick, into study/alternatives/: the long
                                         task at upr 16 for the unclipped update, ACPO alpha 3 and DAPO, then GSPO, SAPO
                                         and the authors' DCPO, on 500 held-out problems with the coupled sampler;
                                         `--levels a`: the unclipped update, GSPO, SAPO and TRL's CISPO at the addition's
                                         level a, into study/smollm2/ beside the committed cells they pair with
    acpo-study plan [--quick|--pilot|--drift|--real-model|--ablation|--guard|--second-task|--long-task|--alternatives]
                                         the runs it would do and their estimated time, without running them
    acpo-study report --out DIR          table.md, learning curves and diagnostics PNGs from finished runs
    acpo-study pack --out DIR            pack DIR's finished run folders into DIR/runs.jsonl.gz (pack.py), which
                                         report and run read as they read the folders
    acpo-study show --out DIR RUN_ID     print a run's result.json (--file: another of its files), packed or not
    acpo-study drift --lrs 1e-6 1e-5 --out DIR
                                         measure a real model's drift per update index and bin (default: the offline
                                         SmolLM2 on addition, 16 updates per rollout): drift.json, drift.md, drift.png
    acpo-study run --recipe R.yaml --out DIR --jobs 1
                                         the same grid on a real model: each cell an `acpo-train` run of the
                                         recipe R (GPU; --launcher "accelerate launch ... -m acpo_trl.train")

Every option of ``run`` can narrow the grid (``--tasks``, ``--methods``, ``--uprs``, ``--seeds``, ``--alphas``,
``--steps``; ``--levels`` with ``--drift``). Rerunning the same command skips the finished runs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from ..diagnostics.plots import legend, plot_bins_vs_k, plot_gradient_diagnostics, read_metrics
from ..losses import POLICY_LOSSES
from ..tasks.testbed import TESTBED_TASKS
from ..utils.cli_errors import ArgumentParser, UserError, cli_main, user_input
from ..utils.number_checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, argument
from ..utils.run_folder import claimed
from .recipe import DEFAULT_LAUNCHER, RecipeRunSpec, recipe_grid
from .grids import (ALPHAS, DRIFT_LEVELS, DRIFT_VARIANTS, LONG_TASK_SECONDS, LONG_TASK_VARIANTS, PAPER_METHODS,
                    REAL_MODEL_LEVELS, REAL_MODEL_VARIANTS, UPRS, ablation_grid, ablation_hypotheses,
                    alternatives_grid, build_grid, drift_grid, estimate_recipe_seconds, estimate_seconds, guard_grid,
                    is_near_reference, long_task_cell, long_task_grid, measured_seconds, quick_grid, real_model_grid,
                    second_task_grid)
from .cell import STUDY_METHODS
from .coupling import measure as measure_coupling
from .drift import drift_map, level_drift_table, measure
from .mechanism import plot_mechanism
from .pack import PACK, pack, run_file
from .results import group_of, has_runs, is_done, load_results
from .runner import block, check_reproduces, open_blocks, run_grid, work
from .table import write_table
from .testbed import RunSpec, pin_cpu_kernels

# Wall seconds per optimizer step of one run while another runs beside it (2 cores, one torch thread each),
# evaluations and diagnostics included, as the committed grid measured them (grid wall time x 2 jobs / runs / 200
# steps): add1 0.255-0.279, add2 0.288 (warm-up included). Used only by `plan`.
SECONDS_PER_STEP = {"add1": {2: 0.27, 8: 0.27, 16: 0.27}, "add2": {2: 0.29, 8: 0.29, 16: 0.29}}
PILOT_METHODS = ("acpo", "dapo", "cispo")


def _specs(args) -> list:
    if args.recipe:
        if (args.quick or args.pilot or args.drift or args.real_model or args.ablation or args.guard or args.second_task
                or args.long_task or args.alternatives or args.tasks):
            raise UserError("--recipe: the recipe sets the model and task", "drop --quick/--pilot/--drift/"
                            "--real-model/--ablation/--guard/--second-task/--long-task/--alternatives/--tasks")
        return recipe_grid(args.recipe, methods=args.methods or PAPER_METHODS, uprs=args.uprs or UPRS,
                           seeds=range(args.seeds or 8), alphas=ALPHAS if args.alphas is None else args.alphas,
                           steps=args.steps, eval_steps=args.eval_steps,
                           launcher=tuple(shlex.split(args.launcher)) if args.launcher else DEFAULT_LAUNCHER)
    if args.quick:
        return quick_grid()
    if args.ablation:
        specs = ablation_grid(seeds_off_policy=range(args.seeds or 16), seeds_near=range(min(args.seeds or 8, 8)))
        return [s for s in specs if (not args.methods or s.method in args.methods)
                and (not args.uprs or s.upr in args.uprs)]
    if args.second_task:
        return [s for s in second_task_grid(uprs=args.uprs or (2, 16), seeds=range(args.seeds or 8),
                                            results=load_results(args.out))
                if not args.methods or s.method in args.methods]
    if args.alternatives:
        return [s for s in alternatives_grid(_alternatives_part(args), seeds=range(args.seeds or 8))
                if (not args.methods or s.method in args.methods)]
    if args.long_task:
        return [s for s in long_task_grid(results=load_results(args.out), seeds=args.seeds)
                if (not args.methods or s.method in args.methods) and (not args.uprs or s.upr in args.uprs)]
    if args.guard:
        levels = [name for name in ("b", "a") if not args.levels or name in args.levels]
        return [s for s in guard_grid(levels=levels, seeds=range(args.seeds or 8), measures=args.measures or
                                      ("ratio_std", "kl")) if not args.methods or s.method in args.methods]
    if args.real_model:
        variants = [v for v in REAL_MODEL_VARIANTS if not args.methods or v[0] in args.methods]
        levels = [level for level in REAL_MODEL_LEVELS if not args.levels or level.name in args.levels]
        return real_model_grid(levels=levels, variants=variants, uprs=args.uprs or (2, 16), seeds=range(args.seeds or 8))
    if args.drift:
        variants = [v for v in DRIFT_VARIANTS if not args.methods or v[0] in args.methods]
        levels = [level for level in DRIFT_LEVELS if not args.levels or level.name in args.levels]
        return drift_grid(tasks=args.tasks or ("add2",), levels=levels, variants=variants, uprs=args.uprs or (2, 16),
                          seeds=range(args.seeds or 8))
    base = RunSpec()
    if args.steps:
        base = replace(base, steps=args.steps)
    if args.pilot:
        return build_grid(tasks=args.tasks or ("add1",), methods=args.methods or PILOT_METHODS,
                          uprs=args.uprs or (2, 8), seeds=range(args.seeds or 1), alphas=args.alphas or (), base=base)
    methods = None if args.methods == ["all"] else (args.methods or PAPER_METHODS)
    return build_grid(tasks=args.tasks or ("add1", "add2"), methods=methods, uprs=args.uprs or UPRS,
                      seeds=range(args.seeds or 8), alphas=ALPHAS if args.alphas is None else args.alphas, base=base)


def _alternatives_part(args) -> str:
    """``--alternatives``'s part: the addition's level a (``--levels a``) or the long task at its level b (default)."""
    if args.levels not in (None, ["a"], ["b"]):
        raise UserError(f"--levels {' '.join(args.levels)}: --alternatives runs one part at a time (they write to two "
                        "folders)", "give --levels a (the addition) or --levels b (the long task, the default)")
    return "a" if args.levels == ["a"] else "long"


def _estimate(specs: list, jobs: int) -> float:
    # the recipe grids whose parts were measured: their seconds, and what a printed line is per (in the grid's order)
    grids = [measured_seconds(s) for s in specs]
    if grids and None not in grids and all(grid == grids[0] for grid in grids):
        seconds, per = grids[0]
        for name, upr in dict.fromkeys((getattr(s, per), s.upr) for s in specs):  # per line and regime, in order
            cells = [s for s in specs if (getattr(s, per), s.upr) == (name, upr)]
            print(f"  {name}, upr {upr}: {len(cells)} runs, {estimate_recipe_seconds(cells, seconds, jobs) / 3600:.2f} h",
                  flush=True)
        return estimate_recipe_seconds(specs, seconds, jobs)
    if any(not isinstance(s, RunSpec) for s in specs):
        return math.nan  # a recipe's run time depends on the model and the hardware
    return sum(estimate_seconds([s], SECONDS_PER_STEP.get(s.task, SECONDS_PER_STEP["add2"]), jobs=jobs) for s in specs)


def report(out_dir: Path, plots: str = "some", beside: Path | None = None) -> str:
    """Write ``table.md`` and the PNGs under ``out_dir/plots``; returns the table."""
    results = load_results(out_dir)
    table = write_table(results, out_dir / "table.md", hypotheses=ablation_hypotheses())
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    _learning_curves(results, plot_dir)
    _drift_maps(results, out_dir, plot_dir, beside)
    plot_mechanism(results, plot_dir)
    if plots != "none":
        chosen = {}
        for r in results:
            spec = r["spec"]
            key = (group_of(r), r["variant"], spec["upr"])
            if plots == "all" or spec["upr"] == max(s["spec"]["upr"] for s in results):
                if key not in chosen or spec["seed"] < chosen[key]["spec"]["seed"]:
                    chosen[key] = r
        # A run's metrics.jsonl is not kept by git: in a fresh clone the committed plots of earlier runs stay.
        missing = sorted(r["run_id"] for r in chosen.values()
                         if not (out_dir / "runs" / r["run_id"] / "metrics.jsonl").exists())
        if missing:
            print(f"per-run plots: {len(missing)} of {len(chosen)} chosen runs have no metrics.jsonl (git does not "
                  "keep it; run them here to redraw): " + ", ".join(missing))
        for (task, variant, upr), r in sorted(chosen.items()):
            if r["run_id"] in missing:
                continue
            entries = read_metrics(str(out_dir / "runs" / r["run_id"] / "metrics.jsonl"))
            name = f"{task}_{variant}_upr{upr}_seed{r['spec']['seed']}".replace("=", "").replace(")", "")
            name = re.sub(r"[^\w.@-]+", "_", name)  # acpo(alpha=1, clip=[...]) -> acpo_alpha1_clip_...
            title = f"{task} {variant} upr {upr} seed {r['spec']['seed']}"
            plot_bins_vs_k(entries, str(plot_dir / f"{name}_bins.png"), title)
            if any(k.startswith("grad/") for e in entries for k in e):  # the real-model grid logs none
                plot_gradient_diagnostics(entries, str(plot_dir / f"{name}_grad.png"), title)
    return table


def _drift_maps(results: list[dict], out_dir: Path, plot_dir: Path, beside: Path | None = None) -> None:
    """``drift_map.md`` and ``plots/<task>_drift_map.png`` for every task run at several learning rates (drift
    levels), with the real model's drift from ``OUT/drift_smollm2/drift.json`` marked when it is there; with
    ``beside`` (another study's folder: the testbed's drift grid), for every task run at any drift level, with that
    study's map drawn behind it. A recipe's task run at one learning rate (the second task) gets its level's drift
    table, no map: one level draws no curve."""
    lrs = {}
    for r in results:
        lrs.setdefault(r["spec"]["task"], set()).add(r["spec"].get("lr"))
    tasks = sorted(task for task, values in lrs.items() if len(values) > 1 or (beside and values != {None}))
    one_level = sorted(task for task, values in lrs.items() if task not in tasks and values != {None}
                       and any(r["spec"]["task"] == task and r["spec"]["upr"] == 16 for r in results))
    if not tasks and not one_level:
        return
    measured = out_dir / "drift_smollm2" / "drift.json"
    reference = json.loads(measured.read_text()) if measured.exists() else None
    behind = None
    if beside is not None:
        other = load_results(beside)
        other_lrs = {}
        for r in other:
            other_lrs.setdefault(r["spec"]["task"], set()).add(r["spec"].get("lr"))
        other_task = next((t for t, values in sorted(other_lrs.items()) if len(values) > 1), None)
        if other_task is None:
            raise UserError(f"--beside {beside}: no task there was run at several drift levels",
                            "give the testbed's drift grid, e.g. study/drift")
        behind = (f"testbed {other_task}", other, other_task)
    lines = ["## The drift map", ""]
    for task in tasks + one_level:
        lines += [f"### {task}", ""]
        if task in tasks:
            lines += [*drift_map(results, task, reference, plot_dir / f"{task}_drift_map.png", beside=behind), ""]
        lines += ["Each level's drift, measured by the grid's own runs at 16 updates per rollout (k: the update index "
                  "within a rollout, 0..15):", "", *level_drift_table(results, task), ""]
    (out_dir / "drift_map.md").write_text("\n".join(lines))


def _learning_curves(results: list[dict], plot_dir: Path) -> None:
    """Per task: mean held-out sampled accuracy over steps, one panel per regime, one line per variant."""
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib, after the Agg backend is chosen

    for task in sorted({group_of(r) for r in results}):
        runs = [r for r in results if group_of(r) == task]
        uprs = sorted({r["spec"]["upr"] for r in runs})
        fig, axes = plt.subplots(1, len(uprs), figsize=(5 * len(uprs), 4), squeeze=False)
        for ax, upr in zip(axes[0], uprs):
            for variant in sorted({r["variant"] for r in runs}):
                curves = [r["evals"] for r in runs if r["variant"] == variant and r["spec"]["upr"] == upr]
                if not curves:
                    continue
                steps = [e["step"] for e in curves[0]]
                mean = [sum(c[i]["sampled"] for c in curves if i < len(c)) / len(curves) for i in range(len(steps))]
                ax.plot(steps, mean, marker="o", ms=2, lw=1, label=f"{variant} (n={len(curves)})")
            ax.set(title=f"{task}, {upr} updates per rollout", xlabel="optimizer step", ylabel="held-out sampled acc")
            legend(ax, fontsize=6)
        fig.tight_layout()
        fig.savefig(plot_dir / f"{task}_learning_curves.png", dpi=100)
        plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="acpo-study", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "plan"):
        _add_grid_arguments(sub.add_parser(name))
    p = sub.add_parser("report")
    p.add_argument("--out", type=Path, default=Path("study"))
    p.add_argument("--plots", choices=("none", "some", "all"), default="some")
    p.add_argument("--beside", type=Path, default=None,
                   help="another study's folder whose drift map is drawn behind this one's (e.g. study/drift)")
    p = sub.add_parser("pack", help=f"pack a grid's finished run folders into OUT/{PACK}")
    p.add_argument("--out", type=Path, required=True, help="the grid's folder (that `acpo-study run --out` wrote)")
    p = sub.add_parser("show", help="print one file of a run, from its folder or the grid's pack")
    p.add_argument("--out", type=Path, required=True, help="the grid's folder")
    p.add_argument("run", help="the run id, its folder under OUT/runs/ (e.g. add1/acpo/upr16/seed0)")
    p.add_argument("--file", default="result.json", help="which of the run's files (default result.json)")
    p = sub.add_parser("drift", help="measure a real model's off-policy drift per update index and bin")
    p.add_argument("--lrs", nargs="+", type=argument(float, POSITIVE), required=True, help="learning rates to measure")
    p.add_argument("--out", type=Path, default=Path("study/drift/drift_smollm2"))
    p.add_argument("--config", default=None, help="an acpo-train recipe (default: the offline SmolLM2 on addition)")
    p.add_argument("--upr", type=argument(int, AT_LEAST_ONE), default=16, help="optimizer updates per rollout")
    p.add_argument("--rollouts", type=argument(int, AT_LEAST_ONE), default=2, help="rollouts measured")
    p.add_argument("--rollout", type=argument(int, AT_LEAST_ONE), default=None,
                   help="completions per rollout, in mini-batches of rollout / upr (default: the recipe's mini-batch)")
    p.add_argument("--seed", type=argument(int, NON_NEGATIVE), default=0)
    p = sub.add_parser("coupling", help="what the coupled evaluation gains: paired-difference spreads on kept models")
    p.add_argument("--out", type=Path, default=Path("study/alternatives"), help="a grid's folder with models/")
    p.add_argument("--pairs", nargs="+", default=["acpo:unclipped", "acpo:dapo"],
                   help="variant pairs FIRST:SECOND paired by seed (default acpo:unclipped acpo:dapo)")
    p.add_argument("--limit", type=argument(int, AT_LEAST_ONE), default=100, help="the first N held-out problems")
    p.add_argument("--jobs", type=argument(int, AT_LEAST_ONE), default=2, help="evaluations at a time")
    p = sub.add_parser("_work", help=argparse.SUPPRESS)
    p.add_argument("queue", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--session", required=True)
    return parser


def _add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """``run`` and ``plan``: which grid, where, and how many jobs."""
    p.add_argument("--out", type=Path, default=None,
                   help="default study/ (with --drift: study/drift/, with --real-model, --ablation, --guard, --second-task "
                        "or --alternatives --levels a: study/smollm2/, with --long-task: study/running_sum/, with "
                        "--alternatives: study/alternatives/)")
    p.add_argument("--cache", type=Path, default=None, help="warm-up cache (default: OUT/warmups)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--pilot", action="store_true")
    mode.add_argument("--drift", action="store_true", help="the drift grid (learning rate as the drift axis)")
    mode.add_argument("--real-model", action="store_true",
                      help="the real-model grid (SmolLM2-135M-Instruct on CPU, two drift levels)")
    mode.add_argument("--second-task", action="store_true",
                      help="the real-model grid's level b on single-digit multiplication")
    mode.add_argument("--long-task", action="store_true",
                      help="where bins can matter: running sums worked step by step, level b, 8 rollouts per run")
    mode.add_argument("--alternatives", action="store_true",
                      help="against what a TRL user would otherwise pick: GSPO, SAPO, TRL's CISPO, DCPO and no clip "
                           "beside ACPO (the long task; --levels a: the addition's level a)")
    mode.add_argument("--guard", action="store_true",
                      help="the drift guard on the real model (levels b, a; --levels b: one)")
    mode.add_argument("--ablation", action="store_true",
                      help="why ACPO wins: the real-model grid's level b with H1/H2/H3 variants (--seeds: upr 16)")
    p.add_argument("--jobs", type=argument(int, NON_NEGATIVE), default=None,
                   help="worker processes (0: run in this process; default 2 on the testbed, 1 with --recipe)")
    p.add_argument("--recipe", type=Path, default=None,
                   help="an acpo-train YAML: each cell is an acpo-train run of it (real model, GPU)")
    p.add_argument("--launcher", default=None,
                   help="--recipe: the command that runs acpo-train (default: python -m acpo_trl.train)")
    p.add_argument("--eval-steps", type=argument(int, AT_LEAST_ONE), default=50,
                   help="--recipe: held-out evaluation every N steps")
    p.add_argument("--tasks", nargs="+", default=None)
    p.add_argument("--levels", nargs="+", default=None,
                   help=f"--drift: drift levels ({', '.join(level.name for level in DRIFT_LEVELS)}); --real-model: "
                        f"{', '.join(level.name for level in REAL_MODEL_LEVELS)} (default all)")
    p.add_argument("--measures", nargs="+", choices=("ratio_std", "kl"), default=None,
                   help="--guard: the guard's measures (default both; kl runs at level a)")
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"policy losses (default {' '.join(PAPER_METHODS)}; 'all': every registered one), or the "
                        "study's names: dapo and the entropy methods at the ACPO authors' clip 0.2 / 0.3, gspo "
                        "(ppo_clip at sequence level, TRL's 3e-4 / 4e-4), cispo (masked_cispo)")
    p.add_argument("--uprs", nargs="+", type=argument(int, AT_LEAST_ONE), default=None)
    p.add_argument("--seeds", type=argument(int, AT_LEAST_ONE), default=None, help="number of seeds (0..N-1)")
    p.add_argument("--alphas", nargs="*", type=argument(float, NON_NEGATIVE), default=None,
                   help="ACPO alpha sweep besides 3.0")
    p.add_argument("--steps", type=argument(int, AT_LEAST_ONE), default=None,
                   help="RL optimizer steps per run (default 200)")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--no-check", action="store_true",
                   help="resume without first checking that this machine reproduces a finished run")
    p.add_argument("--plots", choices=("none", "some", "all"), default="some")


def _check_args(args) -> None:
    """Unknown --methods / --tasks or a missing --recipe fail before the grid starts, not in each of its runs."""
    for flag, given, known in (("--methods", args.methods, [*POLICY_LOSSES, *STUDY_METHODS, "all"]),
                               ("--tasks", args.tasks, TESTBED_TASKS)):
        unknown = [name for name in given or () if name not in known]
        if unknown:
            raise UserError(f"{flag}: unknown {', '.join(unknown)}", f"choose from {', '.join(sorted(known))}")
    if args.levels is not None:
        if not (args.drift or args.real_model or args.guard or args.alternatives):
            raise UserError("--levels: only the drift grids have drift levels", "add --drift, --real-model, --guard "
                            "or --alternatives, or drop --levels")
        names = [level.name for level in (DRIFT_LEVELS if args.drift else REAL_MODEL_LEVELS)]
        unknown = [name for name in args.levels if name not in names]
        if unknown:
            raise UserError(f"--levels: unknown {', '.join(unknown)}", f"choose from {', '.join(names)}")
    if args.measures is not None and not args.guard:
        raise UserError("--measures: only the guard's grid has measures", "add --guard, or drop --measures")
    if args.recipe is not None and not args.recipe.is_file():
        raise UserError(f"--recipe {args.recipe}: no such file", "give an acpo-train YAML recipe, e.g. from configs/")


@cli_main("acpo-study")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "_work":
        torch.set_num_threads(1)
        work(args.queue, args.out, args.cache, args.session, log=lambda m: print(m, flush=True))
        return 0
    if args.command in ("pack", "show"):
        return _pack_or_show(args)
    if args.command in ("report", "coupling", "drift"):
        return _measure(args)
    if args.out is None:
        args.out = _default_out(args)
    _check_args(args)
    with user_input(ValueError), user_input(yaml.YAMLError, fix=f"fix the YAML syntax of --recipe {args.recipe}"):
        specs = _specs(args)
    if specs and isinstance(specs[0], RecipeRunSpec):
        specs[0].check()  # the recipe's own values, once
    if args.jobs is None:
        args.jobs = 1 if args.recipe else 2  # (the real model on CPU too: two runs of one thread each)
    cache = args.cache or args.out / "warmups"
    todo = [s for s in specs if not is_done(s, args.out)]
    estimate = _estimate(todo, args.jobs)
    if math.isnan(estimate):
        print(f"{len(specs)} runs ({len(todo)} to do) of {args.recipe}, {args.jobs} at a time", flush=True)
    else:
        warmups = " (+ warm-ups, ~3-5 min each)" if all(isinstance(s, RunSpec) for s in specs) else ""
        print(f"{len(specs)} runs ({len(todo)} to do); estimated {estimate / 3600:.2f} h with {args.jobs} jobs"
              f"{warmups}", flush=True)
    _plan_notes(args, todo)
    if args.command == "plan":
        return 0
    # One grid session per folder: a session's claims on cells do not see another's (runner._claim).
    with claimed(args.out, "acpo-study", field="--out"):
        return _run(args, specs, todo, cache)


def _measure(args) -> int:
    """``report``, ``coupling`` and ``drift``: what a grid's runs, or a drift measurement, say."""
    if args.command == "report":
        if not has_runs(args.out):
            raise UserError(f"--out {args.out}: no runs", "give the folder that `acpo-study run --out` wrote")
        if args.beside is not None and not has_runs(args.beside):
            raise UserError(f"--beside {args.beside}: no runs", "give the folder of another study, e.g. study/drift")
        print(report(args.out, args.plots, args.beside))
    elif args.command == "coupling":
        pairs = [tuple(pair.split(":")) for pair in args.pairs]
        if any(len(pair) != 2 or not all(pair) for pair in pairs):
            raise UserError(f"--pairs {' '.join(args.pairs)}: give each pair as FIRST:SECOND", "e.g. acpo:unclipped")
        with user_input(ValueError):
            print(measure_coupling(args.out, pairs, args.limit, args.jobs, log=lambda m: print(m, flush=True)))
    else:
        if args.config is not None and not Path(args.config).is_file():
            raise UserError(f"--config {args.config}: no such file", "give an acpo-train YAML recipe, e.g. from configs/")
        with claimed(args.out, "acpo-study", field="--out"):
            measure(args.lrs, args.out, recipe=args.config, upr=args.upr, rollouts=args.rollouts, seed=args.seed,
                    rollout=args.rollout)
        print((args.out / "drift.md").read_text())
    return 0


def _default_out(args) -> Path:
    """The folder a grid writes to unless ``--out`` names one: where its committed runs are."""
    if args.drift:
        return Path("study/drift")
    if args.real_model or args.ablation or args.guard or args.second_task or (args.alternatives
                                                                             and args.levels == ["a"]):
        return Path("study/smollm2")
    if args.long_task:
        return Path("study/running_sum")
    return Path("study/alternatives") if args.alternatives else Path("study")


def _plan_notes(args, todo: list) -> None:
    """What the estimate leaves out: the cells a grid decides while it runs (the second task's and the long task's
    cells at 2 updates per rollout)."""
    if args.second_task:
        part1 = ablation_grid()
        unfinished = [s for s in part1 if not is_done(s, args.out)]
        if unfinished and args.command == "run":
            raise UserError(f"--second-task: the ablation has {len(unfinished)} of its {len(part1)} runs left in "
                            f"{args.out}, and its verdicts decide which of its variants join the second task",
                            "finish it first: acpo-study run --ablation")
        if unfinished:
            print(f"  the ablation has {len(unfinished)} of {len(part1)} runs left: the variants that join from it "
                  "are provisional", flush=True)
        near = [s for s in todo if s.upr == 2 and not is_near_reference(s)]
        if near:
            print(f"  an upper bound: of the {len(near)} other cells at 2 updates per rollout, a seed's are dropped when "
                  "no variant's clip binds on its ACPO alpha 3 run (docs/RESULTS.md, \"A second task\")", flush=True)
    if args.long_task:
        undecided = [s for s in long_task_grid(seeds=args.seeds) if s.upr == 2 and s.method == "acpo"
                     and not is_done(s, args.out) and (not args.methods or "dapo" in args.methods)]
        if undecided:
            dapo = [long_task_cell(LONG_TASK_VARIANTS[1], 2, s.seed) for s in undecided]
            print(f"  and up to {len(dapo)} runs of dapo at upr 2, {estimate_recipe_seconds(dapo, LONG_TASK_SECONDS, args.jobs) / 3600:.2f} "
                  "h, for the seeds whose ACPO alpha 3 run there moves a token outside [0.8, 1.2] (DAPO's clip could "
                  "bind; docs/RESULTS.md, \"A task with long, worked completions\")", flush=True)


def _run(args, specs: list, todo: list, cache: Path) -> int:
    """Run the grid (``todo``: its unfinished specs) into ``args.out``, then its report; returns the exit status."""
    testbed = all(isinstance(spec, RunSpec) for spec in specs)
    if testbed and args.jobs == 0:
        pin_cpu_kernels()  # before torch runs a kernel (ATen reads them at its first dispatch, not at import)
    left: list = []
    if testbed and not args.no_check and 0 < len(todo) < len(specs):
        specs, left = _runnable_here(specs, args.out, cache)
    start = time.time()
    if args.second_task:  # its reference runs decide which cells at 2 updates per rollout would repeat them
        run_grid([s for s in specs if is_near_reference(s)], args.out, cache, jobs=args.jobs,
                 log=lambda m: print(m, flush=True))  # a failed one is retried, and reported, below
        specs = _specs(args)
        print(f"{len(specs)} runs once the reference runs decided the cells at 2 updates per rollout", flush=True)
    failed = run_grid(specs, args.out, cache, jobs=args.jobs, log=lambda m: print(m, flush=True))
    if args.long_task:  # the finished reference runs at 2 updates per rollout decide DAPO's cells there
        queued = {spec.run_id for spec in specs}
        decided = [s for s in _specs(args) if s.run_id not in queued]
        failed += run_grid(decided, args.out, cache, jobs=args.jobs, log=lambda m: print(m, flush=True))
    print(f"grid finished in {time.time() - start:.0f} s; {len(failed)} failed: {failed}", flush=True)
    if left:
        print(f"left for a machine that reproduces them: {len(left)} blocks ({_blocks(left)})", flush=True)
    if not args.no_report:
        print(report(args.out, args.plots))
    return 1 if failed or left else 0


def _pack_or_show(args) -> int:
    """``pack``: pack the finished runs of ``--out`` (refused while a grid runs into it); ``show``: print a file of
    one run."""
    if args.command == "show":
        text = run_file(args.out, args.run.strip("/"), args.file)
        print(text, end="" if text.endswith("\n") else "\n")
        return 0
    if not has_runs(args.out):
        raise UserError(f"--out {args.out}: no runs", "give the folder that `acpo-study run --out` wrote")
    with claimed(args.out, "acpo-study", field="--out"):
        packed, total = pack(args.out)
    print(f"{args.out / PACK}: {packed} run folder(s) packed, {total} runs in the pack")
    return 0


def _blocks(blocks: list[tuple[str, int]]) -> str:
    return ", ".join(f"{group} seed {seed}" for group, seed in blocks)


def _runnable_here(specs: list, out: Path, cache: Path) -> tuple[list, list[tuple[str, int]]]:
    """(the specs this machine may add to the grid, the blocks it leaves). A machine that reproduces a finished run
    bit for bit resumes everything; another one is another testbed (its warm-up differs), so it runs only the blocks
    (group, seed) that hold no run of the other's: a block's variants and regimes are compared run for run, while
    two blocks are two draws of the testbed, its warm-up included (docs/RESULTS.md, "Reproducibility")."""
    check = check_reproduces(specs, out, cache, log=lambda m: print(m, flush=True))
    print(check.message, flush=True)
    if check.reproduced:
        return specs, []
    if check.warmup_digest == check.stored_digest:
        raise UserError(f"{check.message}, from the same warm-up: this machine's kernels differ after the warm-up",
                        "resume on a machine that reproduces the finished runs, or pass --no-check")
    runnable, closed = open_blocks(specs, out, check.warmup_digest)
    left = sorted({block(s) for s in specs if block(s) in closed and not is_done(s, out)})
    if not any(not is_done(s, out) for s in runnable):
        raise UserError(f"{check.message}; every unfinished run is in a block begun on another testbed "
                        f"({_blocks(left)})", "resume on a machine that reproduces them, or pass --no-check to mix "
                        "testbeds within a block")
    print(f"this machine is another testbed (warm-up {check.warmup_digest}): it runs only the blocks with none of "
          f"the other's runs", flush=True)
    return runnable, left


if __name__ == "__main__":
    sys.exit(main())
