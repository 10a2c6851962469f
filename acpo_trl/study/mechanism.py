"""The paper's mechanism, looked for across a study's runs: from few to many updates per rollout, does the ratio's
dispersion grow most in the low-probability bins, does a fixed clip then clip those bins' tokens, and does the token
group that dominates the gradient change (ACPO, Sec. 3: a fixed clip "reverses which token group dominates")?

Per task, variant and regime (updates per rollout), means over seeds of each run's means (``result.json``'s
``diagnostics``; bins by current probability, ACPO's, 0 = least likely):

- **ratio std at the last update** of a rollout (k = upr - 1), per bin;
- **clip %**: the method's own clip fraction per bin (tokens of either advantage sign), over the late updates;
- **gradient share** per bin, ``grad/k{k}/share/bin{b}/pos + .../neg`` (diagnostics.gradients: <g_b, g_used> /
  |g_used|^2, summing to 1 over bins), over the late updates, and the **dominant bin**, the one with the largest share.

The late updates are k >= upr // 2, the second half of a rollout (k = 1 at 2 updates per rollout), where the drift
the paper describes has built up; k = 0 is on-policy (r = 1), where no clip binds. The figure adds, against k itself,
the gradient share of the low-probability tokens (bins 0-1, current probability below 2 / 5): whether it falls as a
rollout's updates go on is the paper's reversal seen within one rollout.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .results import group_of
from .stats import clip_metric, mean, shown

NUM_BINS = 5
LOW_BINS = (0, 1)


def _late(k: int, upr: int) -> bool:
    return k >= upr // 2


def _grad_k(result: dict) -> dict:
    """The run's gradient shares per update index, ``{"share/bin{b}/{pos|neg}": {k: share}}`` (empty if not logged)."""
    return result.get("diagnostics", {}).get("grad_k", {})


def _share(grad_k: dict, bins, k: str) -> float:
    """The gradient share of the tokens in ``bins``, both advantage signs, at update index k."""
    return sum(grad_k.get(f"share/bin{b}/{s}", {}).get(k, 0.0) for b in bins for s in ("pos", "neg"))


def _run_profile(result: dict) -> dict[str, list[float]]:
    """One run's per-bin ratio std at its last update, clip fraction and gradient share over its late updates."""
    upr, bins, grad_k = result["spec"]["upr"], result["diagnostics"].get("bins", {}), _grad_k(result)
    std = [bins.get("ratio_std", {}).get(f"{upr - 1},{b}", math.nan) for b in range(NUM_BINS)]

    def late_cells(metric: str, b: int) -> list[float]:
        return [v for kb, v in bins.get(metric, {}).items()
                if kb.endswith(f",{b}") and _late(int(kb.split(",")[0]), upr)]

    share_tokens = [mean(late_cells("token_frac", b)) for b in range(NUM_BINS)]
    clip = [mean([mean(late_cells(clip_metric([result], s), b)) for s in ("pos", "neg")]) for b in range(NUM_BINS)]
    share = [mean([_share(grad_k, (b,), k) for k in grad_k.get(f"share/bin{b}/pos", {}) if _late(int(k), upr)])
             for b in range(NUM_BINS)]
    return {"ratio_std_last": std, "clip": clip, "grad_share": share, "token_frac": share_tokens}


def mechanism_profiles(results: list[dict]) -> dict[tuple[str, str, int], dict]:
    """{(group, variant, upr): {"runs": n, metric: per-bin means over seeds}} for the runs that logged the gradient
    shares per update index, in groups run at more than one regime."""
    cells: dict = defaultdict(list)
    for r in results:
        if any(key.startswith("share/") for key in _grad_k(r)):
            cells[(group_of(r), r["variant"], r["spec"]["upr"])].append(_run_profile(r))
    regimes = defaultdict(set)
    for group, _, upr in cells:
        regimes[group].add(upr)
    profiles = {}
    for key, runs in sorted(cells.items()):
        if len(regimes[key[0]]) > 1:
            profiles[key] = {"runs": len(runs), **{metric: [mean([run[metric][b] for run in runs])
                                                            for b in range(NUM_BINS)] for metric in runs[0]}}
    return profiles


def low_share_by_k(results: list[dict]) -> dict[tuple[str, str, int], dict[int, float]]:
    """{(group, variant, upr): {k: mean over runs of the gradient share of bins LOW_BINS at update index k}}, for the
    runs that logged the shares per k."""
    per_k: dict = defaultdict(lambda: defaultdict(list))
    for r in results:
        grad_k = _grad_k(r)
        for k in grad_k.get(f"share/bin{LOW_BINS[0]}/pos", {}):
            per_k[(group_of(r), r["variant"], r["spec"]["upr"])][int(k)].append(_share(grad_k, LOW_BINS, k))
    return {cell: {k: mean(v) for k, v in sorted(by_k.items())} for cell, by_k in sorted(per_k.items())}


def dominant_bin(shares: list[float]) -> int | None:
    """The bin with the largest gradient share (the least likely one on a tie), or None when none is defined."""
    finite = [(v, -b) for b, v in enumerate(shares) if math.isfinite(v)]
    return -max(finite)[1] if finite else None


def mechanism_table(results: list[dict]) -> list[str]:
    """The Markdown section of the module docstring (empty when no group has the per-k gradient shares at two
    regimes)."""
    profiles = mechanism_profiles(results)
    if not profiles:
        return []

    def row(values, spec, scale=1):
        return " / ".join(shown(scale * v, spec) for v in values)

    lines = ["## The mechanism: 2 against 16 updates per rollout", "",
             "Means over seeds, per current-probability bin 0..4 (0 = least likely): the ratio std at the last update "
             "of a rollout; over the late updates (k >= upr / 2; k = 1 at 2 updates per rollout) the method's own clip "
             "% (both advantage signs) and the gradient share of the bin's tokens (<g_bin, g_used> / |g_used|^2, "
             "summing to 1; acpo_trl/study/mechanism.py); dominant: the bin with the largest share; bins 0-1: their "
             "summed share over the early updates (k < upr / 2) and the late ones.", "",
             "| task | variant | upr | runs | ratio std at k = upr - 1 | clip % (late) | gradient share (late) | "
             "dominant bin | bins 0-1 share, early → late | token share (late) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_k = low_share_by_k(results)
    for (group, variant, upr), p in profiles.items():
        dominant = dominant_bin(p["grad_share"])
        low = by_k.get((group, variant, upr), {})
        early, late = (mean([v for k, v in low.items() if _late(k, upr) == part]) for part in (False, True))
        lines.append(f"| {group} | `{variant}` | {upr} | {p['runs']} | {row(p['ratio_std_last'], '.3f')} "
                     f"| {row(p['clip'], '.1f', 100)} | {row(p['grad_share'], '.2f')} | "
                     f"{'–' if dominant is None else dominant} | {row([early], '.2f')} → "
                     f"{row([late], '.2f')} | {row(p['token_frac'], '.1f', 100)} |")
    return lines + [""]


def plot_mechanism(results: list[dict], plot_dir: str | Path) -> list[str]:
    """Per group, one figure of four panels: against the bin, the ratio std at the last update, the clip % and the
    gradient share over the late updates, one line per (variant, regime) (a colour per variant; solid: the most
    updates per rollout); against the update index k, the low-probability bins' gradient share at the most updates
    per rollout. Returns the PNG paths."""
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    # deferred: matplotlib (after the Agg backend is chosen), and torch, which acpo_trl.diagnostics imports
    import matplotlib.pyplot as plt

    from ..diagnostics.plots import legend, save_figure

    profiles, by_k = mechanism_profiles(results), low_share_by_k(results)
    written = []
    for group in sorted({key[0] for key in profiles}):
        fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
        most = max(upr for g, _, upr in profiles if g == group)
        colors: dict[str, str] = {}  # one colour per variant, the regime by the line style
        for g, variant, _ in profiles:
            if g == group:
                colors.setdefault(variant, f"C{len(colors)}")
        panels = (("ratio_std_last", "ratio std at the last update of a rollout", 1.0),
                  ("clip", "clip % of the bin's tokens (late updates)", 100.0),
                  ("grad_share", "gradient share of the bin (late updates)", 1.0))
        for ax, (metric, label, scale) in zip(axes[:3], panels):
            for (g, variant, upr), p in profiles.items():
                if g != group:
                    continue
                ax.plot(range(NUM_BINS), [scale * v for v in p[metric]], marker="o", ms=4, color=colors[variant],
                        ls="-" if upr == most else "--", label=f"{variant}, upr {upr} (n={p['runs']})")
            ax.set_xlabel("bin of current probability (0 = least likely)")
            ax.set_ylabel(label)
            ax.set_xticks(range(NUM_BINS))
        for (g, variant, upr), p in profiles.items():
            if g == group and upr == most:
                low = by_k.get((g, variant, upr), {})
                axes[3].plot(list(low), list(low.values()), marker="o", ms=4, color=colors[variant],
                             label=f"{variant} (n={p['runs']})")
        axes[3].set_xlabel(f"update index k within a rollout (upr {most})")
        axes[3].set_ylabel(f"gradient share of bins {LOW_BINS[0]}-{LOW_BINS[-1]}")
        legend(axes[2], fontsize=7, loc="upper left")
        legend(axes[3], fontsize=7, loc="upper left")
        out = Path(plot_dir) / f"{group}_mechanism.png"
        written.append(save_figure(plt, fig, str(out), f"{group}: the mechanism, {most} against fewer updates per rollout"))
    return written
