"""Off-policy drift on a real model, measured with the package's own diagnostics (``acpo-study drift``).

For each learning rate, a short ``acpo-train`` run (in this process) of the recipe with ``diagnostics: true`` and
U optimizer updates per rollout logs, per update index k within a rollout and per probability bin b, the std of the
importance ratio r and of log r, the eps ACPO's rule would set, and the clip fractions by advantage sign. Averaged
over the run's rollouts, these become ``drift.json``, ``drift.md`` (the table) and ``drift.png`` (bin-wise ratio
std and ACPO eps against k, one line per learning rate).

    acpo-study drift --lrs 1e-6 3e-6 1e-5 2e-5 --out study/drift_smollm2

Default recipe: the offline SmolLM2-135M-Instruct (``offline:smollm2``) on the ``addition`` task, 8 prompts x 8
completions per rollout... see :data:`DEFAULT_RECIPE`. Any ``acpo-train`` recipe can be given with ``--config``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# The setting of the measurement that motivated the drift grid (16 updates per rollout, batch 8, 8 completions per
# prompt, 48 new tokens, constant learning rate, no KL): the offline model on single-digit addition.
DEFAULT_RECIPE = {
    "model_name_or_path": "offline:smollm2",
    "dtype": "float32",
    "task": "addition",
    "addition_digits": 1,
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


def drift_argv(recipe: str | None, lr: float, upr: int, rollouts: int, seed: int, output_dir: Path) -> list[str]:
    """The ``acpo-train`` arguments of one measurement run: the recipe (or :data:`DEFAULT_RECIPE`) with the learning
    rate, U = ``upr`` updates per rollout, ``rollouts`` rollouts and the diagnostics on."""
    argv = ["--config", recipe] if recipe else [f"--{k}={v}" for k, v in DEFAULT_RECIPE.items()]
    return argv + [
        f"--learning_rate={lr}", f"--steps_per_generation={upr}", f"--max_steps={upr * rollouts}", f"--seed={seed}",
        "--diagnostics=true", "--diagnostics_grad_every=0", "--report=false", "--push_to_hub=false",
        f"--output_dir={output_dir}",
    ]


def measure(lrs: list[float], out_dir: str | Path, *, recipe: str | None = None, upr: int = 16, rollouts: int = 2,
            seed: int = 0, log=print) -> dict:
    """Run the measurement for every learning rate (skipping the ones already in ``drift.json``) and write the
    outputs. Returns the JSON content: ``{"settings", "runs": {lr: {"bins": {metric: {"k,b": mean}}, ...}}}``."""
    from ..callbacks import MetricsJSONLCallback
    from ..diagnostics.plots import bin_table
    from ..plots import read_metrics
    from ..train import make_parser, run

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "drift.json"
    settings = {"recipe": recipe or DEFAULT_RECIPE, "updates_per_rollout": upr, "rollouts": rollouts, "seed": seed}
    data = json.loads(path.read_text()) if path.exists() else {"settings": settings, "runs": {}}
    if data["settings"] != settings:
        raise ValueError(f"{path} holds a measurement with other settings ({data['settings']}); use another --out.")
    for lr in lrs:
        key = f"{lr:g}"
        if key in data["runs"]:
            log(f"lr {key}: already measured")
            continue
        run_dir = out_dir / f"lr{key}"
        script_args, training_args, model_args = make_parser().parse_args_and_config(
            args=drift_argv(recipe, lr, upr, rollouts, seed, run_dir))
        metrics_path = run_dir / "metrics.jsonl"
        metrics_path.unlink(missing_ok=True)
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
        "0.2, clamp [0, 3]) would set; clip %: the share of the bin's A > 0 / A < 0 tokens that eps clips.",
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
            row.append(f"{clip[0]:.1f} / {clip[1]:.1f}")
            lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(data: dict, path: Path) -> None:
    """Two panels against k: the bin-0 ratio std and the bin-0 eps ACPO would set (one line per learning rate),
    with the other bins dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plots import save_figure

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
    axes[0].legend(fontsize=7)
    save_figure(plt, fig, str(path), f"drift with {upr} updates per rollout")
