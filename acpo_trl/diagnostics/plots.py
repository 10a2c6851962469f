"""PNG plots of the diagnostics in a run's logged metrics (``metrics.jsonl`` entries, one dict per log step).

- :func:`plot_bins_vs_k`: per probability bin, against the update index k within a rollout (averaged over the
  run): the eps ACPO gives the bin, the log-ratio std, and the clip fraction of A > 0 and A < 0 tokens (the
  method's own masks when logged, else what ACPO's eps would clip).
- :func:`plot_gradient_diagnostics`: over training, the angle between the used and the unclipped gradient, the
  norm ratio, and the per-bin gradient share (dominance) for each advantage sign.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from ..plots import legend, save_figure

_BIN_KEY = re.compile(r"diag/k(\d+)/bin(\d+)/(.+)")


def bin_table(entries: list[dict], reduce=None) -> dict[str, dict[tuple[int, int], float]]:
    """metric name -> {(k, bin): mean (or ``reduce``, e.g. ``max``) over the log entries where it is finite}."""
    sums: dict = defaultdict(lambda: defaultdict(list))
    for entry in entries:
        for key, value in entry.items():
            match = _BIN_KEY.fullmatch(key)
            if match and isinstance(value, (int, float)) and math.isfinite(value):
                sums[match.group(3)][(int(match.group(1)), int(match.group(2)))].append(value)
    reduce = reduce or (lambda values: sum(values) / len(values))
    return {name: {kb: reduce(v) for kb, v in cells.items()} for name, cells in sums.items()}


def _setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bins_vs_k(entries: list[dict], out_png: str, title: str = "") -> str:
    """2 x 2 panels of per-bin diagnostics against k (see the module docstring). Returns ``out_png``."""
    plt = _setup()
    table = bin_table(entries)
    pos = "clip_frac_pos" if "clip_frac_pos" in table else "acpo_clip_frac_pos"
    neg = "clip_frac_neg" if "clip_frac_neg" in table else "acpo_clip_frac_neg"
    panels = [
        ("acpo_eps", "eps ACPO gives the bin"),
        ("logratio_std", "std of log r in the bin"),
        (pos, f"clip fraction, A > 0 ({'method' if pos == 'clip_frac_pos' else 'ACPO rule'})"),
        (neg, f"clip fraction, A < 0 ({'method' if neg == 'clip_frac_neg' else 'ACPO rule'})"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (name, label) in zip(axes.flat, panels):
        cells = table.get(name, {})
        for b in sorted({b for _, b in cells}):
            points = sorted((k, v) for (k, bb), v in cells.items() if bb == b)
            ax.plot(*zip(*points), marker="o", ms=3, label=f"bin {b}")
        ax.set(xlabel="update index k within the rollout", title=label)
        legend(ax, fontsize=7)
    return save_figure(plt, fig, out_png, title)


def plot_gradient_diagnostics(entries: list[dict], out_png: str, title: str = "") -> str:
    """Angle, norm ratio and per-bin gradient share over training. Returns ``out_png``."""
    plt = _setup()

    def series(key):
        return [(e["step"], e[key]) for e in entries if isinstance(e.get(key), (int, float)) and math.isfinite(e[key])]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, key, label in ((axes[0, 0], "grad/angle_deg", "angle(used, unclipped) [deg]"),
                           (axes[0, 1], "grad/norm_ratio", "|g_used| / |g_unclipped|")):
        points = series(key)
        if points:
            ax.plot(*zip(*points), marker="o", ms=3)
        ax.set(xlabel="optimizer step", title=label)
    keys = sorted({k for e in entries for k in e if k.startswith("grad/share/")})
    for ax, sign in ((axes[1, 0], "pos"), (axes[1, 1], "neg")):
        for key in [k for k in keys if k.endswith("/" + sign)]:
            points = series(key)
            if points:
                ax.plot(*zip(*points), lw=1, label=key.split("/")[2])
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="optimizer step", title=f"gradient share per bin, A {'>' if sign == 'pos' else '<'} 0")
        legend(ax, fontsize=7)
    return save_figure(plt, fig, out_png, title)
