"""Off-policy drift on a real model, measured with the package's own diagnostics (``acpo-study drift``).

For each learning rate, a short ``acpo-train`` run (in this process) of the recipe with ``diagnostics: true`` and
U optimizer updates per rollout logs, per update index k within a rollout and per probability bin b, the std of the
importance ratio r and of log r, the eps ACPO's rule would set, and the clip fractions by advantage sign. Averaged
over the run's rollouts, these become ``drift.json``, ``drift.md`` (the table) and ``drift.png`` (bin-wise ratio
std and ACPO eps against k, one line per learning rate).

    acpo-study drift --lrs 1e-6 3e-6 1e-5 2e-5 --out study/drift/drift_smollm2

Default recipe: the offline SmolLM2-135M-Instruct (``offline:smollm2``) on the ``addition`` task, 8 prompts x 8
completions per rollout... see :data:`DEFAULT_RECIPE`. Any ``acpo-train`` recipe can be given with ``--config``.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..utils.cli_errors import parse_config
from .cell import naming_options
from .results import group_of
from .stats import summarize

# The setting of the measurement that motivated the drift grid (16 updates per rollout, batch 8, 8 completions per
# prompt, 48 new tokens, constant learning rate, no KL): the offline model on single-digit addition.
DEFAULT_RECIPE = {
    "model_name_or_path": "offline:smollm2",
    "dtype": "float32",
    "task": "addition",
    "arithmetic_digits": 1,
    "prompt_template": "chat",
    "num_train_tasks": 512,
    "use_cpu": True,
    "bf16": False,
    "per_device_train_batch_size": 8,
    "num_generations": 8,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 48,
    "temperature": 1.0,
    "lr_scheduler_type": "constant",
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "beta": 0.0,
    "policy_loss": "acpo",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "disable_tqdm": True,
}
METRICS = ("ratio_std", "logratio_std", "acpo_eps", "clip_frac_pos", "clip_frac_neg", "acpo_clip_frac_pos",
           "acpo_clip_frac_neg", "token_frac")


def drift_argv(recipe: str | None, lr: float, upr: int, rollouts: int, seed: int, output_dir: Path,
               rollout: int | None = None) -> list[str]:
    """The ``acpo-train`` arguments of one measurement run: the recipe (or :data:`DEFAULT_RECIPE`) with the learning
    rate, U = ``upr`` updates per rollout, ``rollouts`` rollouts and the diagnostics on; with ``rollout``, every
    rollout is that many completions in mini-batches of ``rollout / upr`` (a study grid's regime), else the recipe's
    mini-batch."""
    argv = ["--config", recipe] if recipe else [f"--{k}={v}" for k, v in DEFAULT_RECIPE.items()]
    if rollout is not None:
        if rollout % upr:
            raise ValueError(f"--rollout {rollout}: must split into --upr {upr} mini-batches.")
        argv.append(f"--per_device_train_batch_size={rollout // upr}")
    return argv + [
        f"--learning_rate={lr}", f"--steps_per_generation={upr}", f"--max_steps={upr * rollouts}", f"--seed={seed}",
        "--diagnostics=true", "--diagnostics_grad_every=0", "--report=false", "--push_to_hub=false",
        "--save_strategy=no", "--save_final_model=false",  # the trained weights are not part of the measurement
        f"--output_dir={output_dir}",
    ]


def measure(lrs: list[float], out_dir: str | Path, *, recipe: str | None = None, upr: int = 16, rollouts: int = 2,
            seed: int = 0, rollout: int | None = None, log=print) -> dict:
    """Run the measurement for every learning rate (skipping the ones already in ``drift.json``) and write the
    outputs. Returns the JSON content: ``{"settings", "runs": {lr: {"bins": {metric: {"k,b": mean}}, ...}}}``."""
    # deferred: TRL, transformers and torch, which the measurement needs and this module's drift tables do not
    from ..diagnostics.plots import bin_table, read_metrics
    from ..recipe import make_parser
    from ..run import run
    from ..training.callbacks import MetricsJSONLCallback

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "drift.json"
    settings = {"recipe": recipe or DEFAULT_RECIPE, "updates_per_rollout": upr, "rollouts": rollouts, "seed": seed,
                **({"rollout": rollout} if rollout is not None else {})}
    data = json.loads(path.read_text()) if path.exists() else {"settings": settings, "runs": {}}
    if data["settings"] != settings:
        raise ValueError(f"{path} holds a measurement with other settings ({data['settings']}); use another --out.")
    for lr in lrs:
        key = f"{lr:g}"
        if key in data["runs"]:
            log(f"lr {key}: already measured")
            continue
        run_dir = out_dir / f"lr{key}"
        script_args, training_args, model_args = parse_config(
            make_parser(), drift_argv(recipe, lr, upr, rollouts, seed, run_dir, rollout))
        metrics_path = run_dir / "metrics.jsonl"
        log(f"lr {key}: {upr * rollouts} optimizer steps ({rollouts} rollouts of {upr} updates)")
        trainer = run(script_args, training_args, model_args, callbacks=[MetricsJSONLCallback(str(metrics_path))])
        entries = read_metrics(str(metrics_path))
        table = bin_table(entries)
        data["runs"][key] = {
            "lr": lr,
            "model": model_args.model_name_or_path,
            "policy_loss": training_args.policy_loss,
            "steps": trainer.state.global_step,
            "bins": {name: {f"{k},{b}": v for (k, b), v in cells.items()} for name, cells in table.items()
                     if name in METRICS},
        }
        path.write_text(json.dumps(data, indent=1))
    write_table(data, out_dir / "drift.md")
    plot(data, out_dir / "drift.png")
    return data


def cell(data: dict, lr_key: str, metric: str, k: int, b: int) -> float:
    value = data["runs"][lr_key]["bins"].get(metric, {}).get(f"{k},{b}")
    return math.nan if value is None else value


def write_table(data: dict, path: Path) -> str:
    """Per learning rate, at the first off-policy update (k = 1) and the last (k = U - 1): per bin the ratio std,
    the log-ratio std, ACPO's eps and its clip fractions (A > 0 / A < 0)."""
    upr = data["settings"]["updates_per_rollout"]
    runs = sorted(data["runs"], key=lambda key: data["runs"][key]["lr"])
    model = next(iter(data["runs"].values()))["model"] if runs else "?"
    lines = [
        f"## Drift of `{model}` with {upr} updates per rollout",
        "",
        f"Means over {data['settings']['rollouts']} rollouts (seed {data['settings']['seed']}) of the per-micro-batch "
        "statistics, per probability bin 0..4 (current probability, ACPO's bins). eps: what ACPO's rule (alpha 3, base "
        "0.2, clamp [0, 3]) would set; clip %: the share of the bin's A > 0 / A < 0 tokens that eps clips (-: none "
        "in the bin).",
        "",
        "| lr | k | ratio std, bins 0..4 | log-ratio std, bins 0..4 | ACPO eps, bins 0..4 | ACPO clip % A>0 / A<0, bin 0 |",
        "|---|---|---|---|---|---|",
    ]
    for key in runs:
        for k in (1, upr - 1):
            row = [key, str(k)]
            for metric, fmt in (("ratio_std", "{:.3f}"), ("logratio_std", "{:.3f}"), ("acpo_eps", "{:.2f}")):
                row.append(" / ".join(fmt.format(cell(data, key, metric, k, b)) for b in range(5)))
            clip = [100 * cell(data, key, f"acpo_clip_frac_{s}", k, 0) for s in ("pos", "neg")]
            row.append(" / ".join("-" if math.isnan(c) else f"{c:.1f}" for c in clip))  # -: no such token
            lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(data: dict, path: Path) -> None:
    """Two panels against k: the bin-0 ratio std and the bin-0 eps ACPO would set (one line per learning rate),
    with the other bins dotted."""
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    # deferred: matplotlib (after the Agg backend is chosen), and torch, which acpo_trl.diagnostics imports
    import matplotlib.pyplot as plt

    from ..diagnostics.plots import legend, save_figure

    upr = data["settings"]["updates_per_rollout"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, key in enumerate(sorted(data["runs"], key=lambda key: data["runs"][key]["lr"])):
        color = f"C{index}"
        for ax, metric in zip(axes, ("ratio_std", "acpo_eps")):
            for b in range(5):
                points = [(k, cell(data, key, metric, k, b)) for k in range(upr)]
                points = [(k, v) for k, v in points if math.isfinite(v)]
                if points:
                    ax.plot(*zip(*points), color=color, lw=2 if b == 0 else 0.6, ls="-" if b == 0 else ":",
                            label=f"lr {key}" if b == 0 else None)
    axes[0].set(xlabel="update index k within the rollout", ylabel="std of r in the bin", yscale="log",
                title="ratio std (bin 0 solid, bins 1-4 dotted)")
    axes[1].set(xlabel="update index k within the rollout", ylabel="eps", title="eps ACPO would set")
    axes[1].axhline(1.0, color="grey", lw=0.8, ls="--")  # above 1 the low clip 1 - eps vanishes
    legend(axes[0], fontsize=7)
    save_figure(plt, fig, str(path), f"drift with {upr} updates per rollout")


# ---------------------------------------------------------------------------------------------------------------
# The drift map: the study's methods across drift levels, against the measured drift


def run_drift(result: dict, k: int | None = None) -> float:
    """A run's drift: the bin-0 ratio std at the last update of its rollouts (k = upr - 1), mean over the run."""
    upr = result["spec"]["upr"]
    value = result.get("diagnostics", {}).get("bins", {}).get("ratio_std", {}).get(f"{upr - 1 if k is None else k},0")
    return math.nan if value is None else value


def _map_runs(results: list[dict], task: str, uprs: tuple[int, ...]) -> list[dict]:
    """The runs that make ``task``'s drift map: the grid's methods as configured, without extra options. Variants
    with options (the ablation's, the drift guard's) are compared in their own report sections and move no level's
    drift (a guard even censors its own: a cut rollout never reaches the last update). Options that change only what
    is logged (``diagnostics_*``, :func:`cell.naming_options`) do not make a variant."""
    return [r for r in results if r["spec"]["task"] == task and r["spec"]["upr"] in uprs
            and not naming_options(r["spec"].get("options", ()))]


def drift_points(results: list[dict], task: str, upr: int = 16) -> list[tuple]:
    """Per drift level of ``task`` (its groups: the task at each learning rate) and variant: (variant, lr, the
    level's drift, the variant's own drift, final accuracy (mean, sd) at the smallest upr and at ``upr``, the drop,
    its interval's ends, seeds). The level's drift is the median over its variants of their ``upr``-update runs'
    drift (:func:`run_drift`), over the runs of :func:`_map_runs`."""
    runs = _map_runs(results, task, (2, upr))
    summary = summarize(runs)
    levels = sorted({(r["spec"].get("lr") or 5e-4, group_of(r)) for r in runs}, reverse=True)
    points = []
    for lr, group in levels:
        data = summary[group]
        if upr not in data["uprs"] or len(data["uprs"]) < 2:
            continue
        near = data["uprs"][0]
        own = {}
        for variant in data["rows"]:
            drifts = [run_drift(r) for r in runs if group_of(r) == group and r["variant"] == variant
                      and r["spec"]["upr"] == upr]
            drifts = [d for d in drifts if math.isfinite(d)]
            if drifts:
                own[variant] = sum(drifts) / len(drifts)
        if not own:
            continue
        level = statistics.median(own.values())
        for variant, row in sorted(data["rows"].items()):
            if variant not in own or not row["regimes"][upr]["n"] or not row["regimes"][near]["n"]:
                continue
            drop, (lo, hi) = row["drop"][upr], row["drop_ci"][upr]
            points.append((variant, lr, level, own[variant], row["regimes"][near]["final"],
                           row["regimes"][upr]["final"], drop, lo, hi, row["regimes"][upr]["n"]))
    return points


def level_drift_table(results: list[dict], task: str, upr: int = 16) -> list[str]:
    """Per drift level of ``task``, its two drift measures from the grid's own ``upr``-update runs: the bin-0 ratio
    std at the last update of a rollout (:func:`run_drift`; median and range over the variants' means) and ACPO alpha
    3's eps (variant ``acpo``): the largest of one logged update (any k, bin, rollout, seed) and the largest run mean
    at one (k, bin), with how many of its runs logged an eps > 1 and, per run, how many of its (k, bin) cells did in
    at least one update (the range over runs), over the runs of :func:`_map_runs`."""
    runs = _map_runs(results, task, (upr,))
    lines = [f"| lr | bin-0 ratio std at k = {upr - 1}, median (variants' range) | ACPO alpha 3: largest eps of one "
             "update | largest run-mean eps at one (k, bin) | ACPO runs with an eps > 1 | (k, bin) cells with an eps > 1 "
             "in some update, per run |", "|---|---|---|---|---|---|"]
    for lr, group in sorted({(r["spec"].get("lr") or 5e-4, group_of(r)) for r in runs}, reverse=True):
        level = [r for r in runs if group_of(r) == group]
        own = {}
        for r in level:
            if math.isfinite(run_drift(r)):
                own.setdefault(r["variant"], []).append(run_drift(r))
        means = [sum(v) / len(v) for v in own.values()]
        acpo = [r["diagnostics"] for r in level if r["variant"] == "acpo" and r.get("diagnostics")]
        # bins_max holds acpo_eps only for runs made since it was tracked (not the testbed's drift grid)
        cells = [d["bins_max"]["acpo_eps"] for d in acpo if d.get("bins_max", {}).get("acpo_eps")]
        largest = [max(c.values()) for c in cells]
        over = [sum(x > 1 for x in c.values()) for c in cells]
        run_mean = [max(d["bins"]["acpo_eps"].values()) for d in acpo if d["bins"].get("acpo_eps")]
        drift = (f"{statistics.median(means):.3f} ({min(means):.3f}-{max(means):.3f})" if means else "–")
        lines.append(f"| {lr:g} | {drift} | {f'{max(largest):.2f}' if largest else 'not logged'} | "
                     f"{f'{max(run_mean):.2f}' if run_mean else '–'} | "
                     f"{f'{sum(x > 1 for x in largest)} of {len(largest)}' if largest else 'not logged'} | "
                     f"{f'{min(over)}-{max(over)} of {len(cells[0])}' if cells else 'not logged'} |")
    return lines


def _curves(points: list[tuple]) -> dict[str, list[tuple]]:
    curves: dict = {}
    for variant, _, level, _, _, far, drop, lo, hi, _ in points:
        curves.setdefault(variant, []).append((level, drop, lo, hi, far[0]))
    return curves


def drift_map(results: list[dict], task: str, reference: dict | None, out_png: Path, upr: int = 16,
              beside: tuple[str, list[dict], str] | None = None) -> list[str]:
    """Per variant and drift level of ``task`` (:func:`drift_points`): the level's drift and the variant's own, its
    final accuracy at the smallest upr and at ``upr``, and the relative drop between them with its 95% bootstrap
    interval. Writes the figure (drop and final accuracy against the level's drift, one line per variant;
    ``reference``'s drift at each of its learning rates marked) and returns the Markdown table. Without ``beside``,
    variants run at a single level are left out; ``beside`` = (label, results, task) draws another study's map
    faintly behind this one's points (the testbed's drift map behind a real model's), so that the two can be read
    at the same drift. The map's axis is the level's drift, not each variant's: how far a method lets the policy
    move within a rollout is one of its outcomes (CISPO does not clip the ratio it weights with), so it is a column,
    not the axis."""
    points = drift_points(results, task, upr)
    if beside is None:  # a variant run at one level only (the committed grid's other baselines) has no curve
        several = {variant for variant, runs in _curves(points).items() if len(runs) > 1}
        points = [p for p in points if p[0] in several]
    lines = [f"| variant | lr | level's drift | variant's drift | final acc, upr 2 | final acc, upr {upr} | "
             f"drop 2→{upr} [95% CI] | seeds |", "|---|---|---|---|---|---|---|---|"]
    for variant, lr, level, drift, near, far, drop, lo, hi, n in sorted(points, key=lambda r: (r[0], r[2])):
        interval = "" if math.isnan(lo) else f" [{100 * lo:+.0f}, {100 * hi:+.0f}]"
        lines.append(f"| `{variant}` | {lr:g} | {level:.3f} | {drift:.3f} | {near[0]:.3f} ± {near[1]:.3f} | "
                     f"{far[0]:.3f} ± {far[1]:.3f} | {100 * drop:+.1f}%{interval} | {n} |")
    behind = None
    if beside is not None:
        label, other_results, other_task = beside
        other = _curves(drift_points(other_results, other_task, upr))
        behind = (label, {variant: runs for variant, runs in other.items() if len(runs) > 1})
    _plot_drift_map(_curves(points), reference, out_png, task, upr, behind)
    return lines


def _plot_drift_map(curves: dict, reference: dict | None, out_png: Path, task: str, upr: int,
                    behind: tuple[str, dict] | None = None) -> None:
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    # deferred: matplotlib (after the Agg backend is chosen), and torch, which acpo_trl.diagnostics imports
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    from ..diagnostics.plots import legend, save_figure

    fig, (ax_drop, ax_acc) = plt.subplots(1, 2, figsize=(13, 4.8))
    markers = "osD^vP*Xh"
    variants = sorted(set(curves) | set(behind[1] if behind else {}))
    layers = [(behind[1], f"{behind[0]}: ", dict(alpha=0.35, lw=0.9, ls="--", mfc="none"))] if behind else []
    layers.append((curves, "", dict(lw=1.4, mfc="none" if not behind else None)))
    for layer, prefix, look in layers:
        for variant, points in sorted(layer.items()):
            index = variants.index(variant)
            points.sort()
            # the variants of a level share its drift: spread them a little sideways (log axis) so their intervals show
            x = [p[0] * 1.06 ** (index - (len(variants) - 1) / 2) for p in points]
            y = [100 * p[1] for p in points]
            err = [[100 * (p[1] - p[2]) if math.isfinite(p[2]) else 0 for p in points],
                   [100 * (p[3] - p[1]) if math.isfinite(p[3]) else 0 for p in points]]
            style = dict(marker=markers[index % len(markers)], ms=5, color=f"C{index}", label=prefix + variant,
                         **{k: v for k, v in look.items() if v is not None})
            ax_drop.errorbar(x, y, yerr=err, capsize=3, **style)
            ax_acc.plot(x, [p[4] for p in points], **style)
    for ax in (ax_drop, ax_acc):
        if reference:
            for key, run in sorted(reference["runs"].items(), key=lambda kv: kv[1]["lr"]):
                value = cell(reference, key, "ratio_std", upr - 1, 0)
                if math.isfinite(value):
                    ax.axvline(value, color="grey", ls="--", lw=0.8)
                    ax.text(value, 0.02, f" {run['model'].split('/')[-1]} lr {key}", rotation=90, va="bottom",
                            fontsize=6, color="grey", transform=ax.get_xaxis_transform())
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5]))
        ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"drift level: bin-0 ratio std at the last of {upr} updates per rollout (median of the variants)")
    ax_drop.axhline(0, color="black", lw=0.6)
    title = f"{task}" + (f" (filled) and the {behind[0]} (dashed)" if behind else "")
    fig.suptitle(title)
    ax_drop.set(ylabel=f"relative drop of final accuracy, upr 2 → {upr} (%)", title="robustness to drift")
    ax_acc.set(ylabel=f"final held-out accuracy at upr {upr}", title="accuracy off-policy")
    legend(ax_drop, fontsize=7, loc="upper left")
    save_figure(plt, fig, str(out_png))


def mean_k3(diagnostics: dict, k: int) -> float | None:
    """k3 = mean(r - 1 - log r) over a run's tokens at update index ``k``, from its per-bin run means:
    sum_b token_frac_b (ratio_mean_b - 1 - logratio_mean_b) over the bins with all three (exact for one step; of run
    means, a product of means). None when no bin has them."""
    bins = diagnostics["bins"]
    cells = [key for key in bins.get("token_frac", {}) if key.startswith(f"{k},") and key in bins.get("ratio_mean", {})
             and key in bins.get("logratio_mean", {})]
    weight = sum(bins["token_frac"][key] for key in cells)
    if not weight:
        return None
    return sum(bins["token_frac"][key] * (bins["ratio_mean"][key] - 1 - bins["logratio_mean"][key])
               for key in cells) / weight


def k3_at_ratio_std(results: list[dict], threshold: float = 0.3, upr: int = 16) -> dict:
    """The k3 that goes with a bin-0 ratio std of ``threshold`` (the drift guard's ``KL_THRESHOLD``): for every
    unguarded run at ``upr`` updates per rollout (no option beyond its method's) whose run-mean bin-0 ratio std
    reaches ``threshold`` at some update index k, its :func:`mean_k3` at the first such k. Returns the median over
    those runs, with each run's (run_id, k, k3) and how many runs never reached it."""
    crossings, never = [], 0
    for r in results:
        spec = r["spec"]
        if spec["upr"] != upr or spec.get("options") or not r.get("diagnostics", {}).get("bins"):
            continue
        stds = r["diagnostics"]["bins"].get("ratio_std", {})
        first = next((k for k in range(upr) if stds.get(f"{k},0", 0.0) >= threshold), None)
        if first is None:
            never += 1
        elif mean_k3(r["diagnostics"], first) is not None:
            crossings.append((r["run_id"], first, mean_k3(r["diagnostics"], first)))
    median = statistics.median(c[2] for c in crossings) if crossings else math.nan
    return {"median": median, "runs": crossings, "never": never}
