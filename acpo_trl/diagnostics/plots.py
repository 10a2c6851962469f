"""PNG plots of a run's logged metrics (``metrics.jsonl`` entries, one dict per log step).

- :func:`plot_training_curves`: reward per rollout, and ACPO's per-bin clip ranges eps_b against the update index k
  within a rollout. eps_b starts every rollout at the base (the ratio is 1 at k = 0) and grows with the ratio's
  spread over the later updates. Where it passes 1, the lower clip 1 - eps_b is below 0 and bounds nothing (only
  the dual clip, if any, still bounds negative-advantage tokens): the extreme-drift regime, where ACPO at alpha 3
  degraded most (docs/RESULTS.md, "The drift map"); fewer updates per rollout, a lower learning rate or
  ``acpo_clip_max`` < 1 keep the lower clip.
- :func:`plot_bins_vs_k`: per probability bin, against the update index k within a rollout (averaged over the
  run): the eps ACPO gives the bin, the log-ratio std, and the clip fraction of A > 0 and A < 0 tokens (the
  method's own masks when logged, else what ACPO's eps would clip).
- :func:`plot_gradient_diagnostics`: over training, the angle between the used and the unclipped gradient, the
  norm ratio, and the per-bin gradient share (dominance) for each advantage sign.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections import defaultdict

_EPS_KEY = re.compile(r"acpo/bin(\d+)/eps")
_DIAG_EPS_KEY = re.compile(r"diag/k(\d+)/bin(\d+)/acpo_eps")
_DIAG_K = re.compile(r"diag/k(\d+)/")
NEAR_ONE = 0.5  # the eps axis reaches 1 once some eps_b is at least this


def read_metrics(path: str) -> list[dict]:
    """The log entries of a ``metrics.jsonl`` file, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _whole(updates_per_rollout: float | None) -> int | None:
    """``updates_per_rollout`` as an int (at least 1: fewer is on-policy too), or None when unknown or fractional."""
    if updates_per_rollout is None:
        return None
    if updates_per_rollout <= 1:
        return 1
    return round(updates_per_rollout) if abs(updates_per_rollout - round(updates_per_rollout)) < 1e-9 else None


def update_indices(entries: list[dict], updates_per_rollout: float | None = None) -> list[int | None]:
    """k, the optimizer update index within its rollout (0-based), of every entry (None where it cannot be told).

    From ``updates_per_rollout`` U when given: k = (step - 1) % U (``step`` is the 1-based optimizer step of the
    entry; one entry per step, ``logging_steps: 1``). Else from the entry's ``diag/k{k}/...`` keys
    (``diagnostics: true``), else from the rollout starts: the steps that log a ``reward`` (once per rollout)."""
    u = _whole(updates_per_rollout)
    ks: list[int | None] = []
    start = None
    for e in entries:
        step = e.get("step")
        if _finite(e.get("reward")) and isinstance(step, int):
            start = step
        if u is not None and isinstance(step, int):
            ks.append((step - 1) % u)
        elif (m := next((_DIAG_K.match(key) for key in e if _DIAG_K.match(key)), None)) is not None:
            ks.append(int(m.group(1)))
        elif start is not None and isinstance(step, int):
            ks.append(step - start)
        else:
            ks.append(None)
    return ks


def eps_by_update(entries: list[dict], updates_per_rollout: float | None = None) -> tuple[dict, str]:
    """({bin: {k: [eps_b at update k of each rollout, in order]}}, source).

    source: "acpo" (the method's own ``acpo/bin{b}/eps``: acpo, acpo_log, bin_clip), "diag" (no bin method, but
    ``diagnostics: true``: ``diag/k{k}/bin{b}/acpo_eps``, ACPO's rule on this run's ratios) or "" (neither)."""
    cells: dict = defaultdict(lambda: defaultdict(list))
    for e, k in zip(entries, update_indices(entries, updates_per_rollout)):
        for key, value in e.items():
            if k is not None and (m := _EPS_KEY.fullmatch(key)) and _finite(value):
                cells[int(m.group(1))][k].append(value)
    if cells:
        return _plain(cells), "acpo"
    for e in entries:
        for key, value in e.items():
            if (m := _DIAG_EPS_KEY.fullmatch(key)) and _finite(value):
                cells[int(m.group(2))][int(m.group(1))].append(value)
    return _plain(cells), "diag" if cells else ""


def _plain(cells) -> dict:
    return {b: dict(sorted(ks.items())) for b, ks in sorted(cells.items())}


def mean_eps_by_update(cells: dict) -> dict[int, dict[int, float]]:
    """{bin: {k: mean over rollouts of eps_b at update k}} of :func:`eps_by_update`'s cells."""
    return {b: {k: sum(v) / len(v) for k, v in ks.items()} for b, ks in cells.items()}


def void_clip_verdict(means: dict[int, dict[int, float]]) -> str:
    """Per bin of :func:`mean_eps_by_update`'s means, the update indices k at which its mean eps_b passes 1 (its
    lower clip 1 - eps_b void): "from k = j" when it stays above 1 from j to the last k, else the ks at which it
    is ("at k = 1-2, 5"), or "none"."""
    parts = []
    for b, ks in sorted(means.items()):
        above = [k for k, v in sorted(ks.items()) if v > 1]
        if not above:
            parts.append(f"bin {b} none")
        elif above == list(range(above[0], max(ks) + 1)):
            parts.append(f"bin {b} from k = {above[0]}")
        else:
            runs = [[above[0], above[0]]]
            for k in above[1:]:
                if k == runs[-1][1] + 1:
                    runs[-1][1] = k
                else:
                    runs.append([k, k])
            parts.append(f"bin {b} at k = " + ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs))
    return "mean eps > 1, lower clip void: " + ", ".join(parts)


def _log_rule(entries: list[dict], source: str) -> bool:
    """Whether eps_b bounds log r (``acpo_log``: r in [e^-eps, e^eps], whose lower clip never vanishes)."""
    if source == "acpo":
        return any(re.fullmatch(r"acpo/bin\d+/logratio_mean", key) for e in entries for key in e)
    return any(e.get("diag/eps_rule_logratio") == 1 for e in entries)


def plot_training_curves(entries: list[dict], out_png: str, title: str = "",
                         updates_per_rollout: float | None = None) -> str:
    """Two panels: reward per rollout over optimizer steps, and eps_b of every ACPO bin against the update index k
    within a rollout (mean over rollouts, band min-max), with the line eps = 1 past which the lower clip 1 - eps
    vanishes (see the module docstring). ``updates_per_rollout``: the run's ``ACPOConfig.updates_per_rollout``;
    without it k is read from the entries (:func:`update_indices`). Returns ``out_png``."""
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib, after the Agg backend is chosen

    fig, (ax_reward, ax_eps) = plt.subplots(1, 2, figsize=(13, 4.5))
    reward = [(e["step"], e["reward"]) for e in entries if _finite(e.get("reward"))]
    if reward:
        ax_reward.plot(*zip(*reward), marker="o", ms=3)
    ax_reward.set(xlabel="optimizer step", ylabel="mean reward of the rollout", title="reward")
    _draw_eps_panel(ax_eps, entries, updates_per_rollout)
    return save_figure(plt, fig, out_png, title, dpi=110)


def _draw_eps_panel(ax, entries: list[dict], updates_per_rollout: float | None) -> None:
    from matplotlib.ticker import MaxNLocator  # deferred: matplotlib, only plotting needs it

    cells, source = eps_by_update(entries, updates_per_rollout)
    num_k = max((k + 1 for ks in cells.values() for k in ks), default=0)
    u = _whole(updates_per_rollout) or num_k
    ax.set(xlabel="update index k within the rollout", ylabel="clip range eps_b")
    if not cells or u <= 1:
        ax.set(xticks=[], yticks=[])
    if not cells:
        ax.set_title("no per-bin clip range logged\n(not a bin method; diagnostics: true logs ACPO's rule)", fontsize=9)
        return
    values = [v for ks in cells.values() for vs in ks.values() for v in vs]
    if u <= 1:
        ax.set_title(f"on-policy (1 update per rollout): ratio = 1, so eps_b = base {sum(values) / len(values):.2f}"
                     "\nin every bin (no drift to adapt to)", fontsize=9)
        return
    means = mean_eps_by_update(cells)
    for b, ks in cells.items():
        line, = ax.plot(list(means[b]), list(means[b].values()), marker="o", ms=3, lw=1.2, label=f"bin {b}")
        ax.fill_between(list(ks), [min(v) for v in ks.values()], [max(v) for v in ks.values()],
                        color=line.get_color(), alpha=0.12, lw=0)
    what = "ACPO's rule on this run's ratios (diagnostics)" if source == "diag" else "clip range per probability bin"
    if _log_rule(entries, source):
        verdict = "in log r: r in [e^-eps, e^eps], the lower clip never vanishes"
    else:
        if any(v > 1 for ks in means.values() for v in ks.values()):
            verdict = textwrap.fill(void_clip_verdict(means), 80)
        else:
            top = max(v for ks in means.values() for v in ks.values())
            verdict = f"mean eps <= {top:.2f} < 1: lower clip kept" + (
                f" (void in some rollouts: max {max(values):.2f})" if max(values) > 1 else "")
        if max(values) >= NEAR_ONE:  # else the line would squash the curves: the title says how far 1 is
            ax.axhline(1.0, color="black", ls="--", lw=1,
                       label="eps = 1: lower clip 1 - eps = 0;\nabove it only the dual clip bounds A < 0")
    ax.set_title(f"{what}, mean over rollouts (band min-max)\n{verdict}", fontsize=9)
    ax.set_xlim(-0.3, u - 0.7)
    ax.set_ylim(0.0, max(ax.get_ylim()[1], 1.1 if max(values) >= NEAR_ONE else 0.0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def legend(ax, **kwargs) -> None:
    """``ax.legend(**kwargs)`` when the axes hold a labelled artist (else matplotlib warns that it found none)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def save_figure(plt, fig, out_png: str, title: str = "", dpi: int = 100) -> str:
    """Title (if any), tight layout, write ``out_png``, close the figure; returns ``out_png``."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)
    return out_png


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
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib, after the Agg backend is chosen

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
