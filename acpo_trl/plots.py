"""Plots of a run's logged metrics (``metrics.jsonl``): reward and ACPO's per-bin clip ranges over steps."""

from __future__ import annotations

import json
import re


def read_metrics(path: str) -> list[dict]:
    """The log entries of a ``metrics.jsonl`` file, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_training_curves(entries: list[dict], out_png: str, title: str = "") -> str:
    """Two panels: reward per rollout, and eps_b of every ACPO bin per optimizer step. Returns ``out_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_reward, ax_eps) = plt.subplots(1, 2, figsize=(11, 4))
    reward = [(e["step"], e["reward"]) for e in entries if e.get("reward") is not None]
    if reward:
        ax_reward.plot(*zip(*reward), marker="o", ms=3)
    ax_reward.set(xlabel="optimizer step", ylabel="mean reward of the rollout", title="reward")
    bins = sorted({int(m.group(1)) for e in entries for k in e if (m := re.fullmatch(r"acpo/bin(\d+)/eps", k))})
    for b in bins:
        points = [(e["step"], e[f"acpo/bin{b}/eps"]) for e in entries if e.get(f"acpo/bin{b}/eps") is not None]
        if points:
            ax_eps.plot(*zip(*points), label=f"bin {b}", lw=1)
    if bins:
        ax_eps.legend(fontsize=8)
    ax_eps.set(xlabel="optimizer step", ylabel="clip range eps_b", title="ACPO clip range per probability bin")
    return save_figure(plt, fig, out_png, title, dpi=110)


def save_figure(plt, fig, out_png: str, title: str = "", dpi: int = 100) -> str:
    """Title (if any), tight layout, write ``out_png``, close the figure; returns ``out_png``."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)
    return out_png
