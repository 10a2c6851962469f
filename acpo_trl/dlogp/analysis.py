"""Analysis of scored responses: summary statistics, log-scale histograms, top tokens by Δlog p, per-token JSON.

Input everywhere: a list of *records*, one per scored response, each a dict with ``source`` (which model generated
the response, e.g. ``"rl"`` or ``"base"``), ``tokens`` (the response's token strings) and one list of floats per
metric of ``metrics.METRICS`` (as :func:`records_from_scores` builds them). The questions are those of Huang et al.
2026, Fig. 2-3: do all metrics pile up near 0 (sparse changes), and does only Δlog p separate RL-generated
(shifted positive) from base-generated (shifted negative) responses?
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from ..diagnostics.plots import legend
from .metrics import METRICS

THRESHOLDS = (0.1, 0.5, 1.0, 2.0)
MASS_SHARES = (0.5, 0.9)


def records_from_scores(tokenizer, response_ids, scores, sources, extra: Sequence[dict] | None = None) -> list[dict]:
    """One record per response from ``score_responses`` output: ids, token strings, metrics as lists, source, and
    the fields of ``extra[i]`` (e.g. prompt index, score)."""
    if not len(response_ids) == len(scores) == len(sources):
        raise ValueError("response_ids, scores and sources must have one entry per response.")
    records = []
    for i, (ids, metrics, source) in enumerate(zip(response_ids, scores, sources)):
        record = {"source": source, "token_ids": list(ids), "tokens": [tokenizer.decode([t]) for t in ids]}
        record.update({name: [round(float(v), 6) for v in metrics[name]] for name in METRICS})
        if extra is not None:
            record.update(extra[i])
        records.append(record)
    return records


def mass_share(values: Sequence[float], share: float) -> float:
    """Smallest fraction of tokens whose |values|, largest first, carry ``share`` of Σ|values| (0 if all are 0).

    A small number means the metric is concentrated on few tokens (sparse).
    """
    magnitudes = sorted((abs(v) for v in values), reverse=True)
    total = sum(magnitudes)
    if total == 0:
        return 0.0
    running = 0.0
    for count, m in enumerate(magnitudes, start=1):
        running += m
        if running >= share * total:
            return count / len(magnitudes)
    return 1.0


def summary(records: Sequence[dict], thresholds: Sequence[float] = THRESHOLDS) -> dict[str, dict[str, dict]]:
    """Per source and metric: token count, mean, median, fraction of tokens with |metric| > each threshold
    (``frac_abs_gt_<t>``) and the sparsity figures ``tokens_for_<s>_mass`` (``mass_share``)."""
    out: dict[str, dict[str, dict]] = {}
    for source in sorted({r["source"] for r in records}):
        chosen = [r for r in records if r["source"] == source]
        out[source] = {}
        for name in METRICS:
            values = [v for r in chosen for v in r[name]]
            if not values:
                continue
            ordered = sorted(values)
            stats: dict[str, Any] = {
                "num_tokens": len(values),
                "mean": sum(values) / len(values),
                "median": ordered[len(ordered) // 2],
            }
            if name == "dlogp":
                stats["frac_positive"] = sum(v > 0 for v in values) / len(values)
            for t in thresholds:
                stats[f"frac_abs_gt_{t:g}"] = sum(abs(v) > t for v in values) / len(values)
            for s in MASS_SHARES:
                stats[f"tokens_for_{int(100 * s)}pct_mass"] = mass_share(values, s)
            out[source][name] = stats
    return out


def top_tokens(records: Sequence[dict], n: int = 20, context: int = 40) -> dict[str, list[dict]]:
    """The ``n`` positions with the largest and the most negative Δlog p, with their token, source, response index,
    position and up to ``context`` characters of the text before them."""
    rows = [
        (value, i, t)
        for i, r in enumerate(records)
        for t, value in enumerate(r["dlogp"])
    ]
    rows.sort(key=lambda row: row[0])

    def entry(value, i, t):
        r = records[i]
        return {
            "dlogp": value,
            "token": r["tokens"][t],
            "source": r["source"],
            "response": i,
            "position": t,
            "context": "".join(r["tokens"][:t])[-context:],
        }

    return {
        "highest": [entry(*row) for row in reversed(rows[-n:])],
        "lowest": [entry(*row) for row in rows[:n]],
    }


def plot_histograms(records: Sequence[dict], out_dir: str | Path, bins: int = 60) -> list[Path]:
    """One PNG per metric (``hist_<metric>.png``): token counts on a log scale, one histogram per source."""
    import matplotlib  # deferred: matplotlib, only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib, after the Agg backend is chosen

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = sorted({r["source"] for r in records})
    paths = []
    for name in METRICS:
        per_source = {s: [v for r in records if r["source"] == s for v in r[name] if math.isfinite(v)] for s in sources}
        values = [v for vs in per_source.values() for v in vs]
        if not values:
            continue
        low, high = min(values), max(values)
        if name == "dlogp":
            bound = max(abs(low), abs(high), 1e-6)
            low, high = -bound, bound
        edges = [low + (high - low) * i / bins for i in range(bins + 1)] if high > low else [low - 0.5, low + 0.5]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for source, vs in per_source.items():
            if vs:
                ax.hist(vs, bins=edges, histtype="step", linewidth=1.5, label=f"{source}-generated ({len(vs)} tokens)")
        ax.set_yscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("tokens (log scale)")
        legend(ax, fontsize=8)
        fig.tight_layout()
        path = out_dir / f"hist_{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def write_analysis(records: Sequence[dict], out_dir: str | Path, top_n: int = 20) -> dict[str, Path]:
    """Write ``tokens.json`` (the records), ``summary.json``, ``top_tokens.json`` and the histograms to ``out_dir``."""
    if not records:
        raise ValueError("No scored responses to analyse: give at least one response.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tokens": out_dir / "tokens.json",
        "summary": out_dir / "summary.json",
        "top_tokens": out_dir / "top_tokens.json",
    }
    files["tokens"].write_text(json.dumps(list(records), ensure_ascii=False))
    files["summary"].write_text(json.dumps(summary(records), indent=2))
    files["top_tokens"].write_text(json.dumps(top_tokens(records, top_n), indent=2, ensure_ascii=False))
    for path in plot_histograms(records, out_dir):
        files[path.stem] = path
    return files
