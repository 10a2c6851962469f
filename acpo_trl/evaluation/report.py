"""Markdown table of evaluation metrics: one row per benchmark plus the macro average, as the papers print them.

Pure Python, reusable by any tool that produces per-benchmark metric dicts (see ``metrics.summarize``).
"""

from __future__ import annotations

from collections.abc import Mapping

from .metrics import macro_average

MACRO_ROW = "macro avg"


def _format(key: str, value: float) -> str:
    if key.startswith(("avg@", "pass@")) or key in ("mean_score", "truncation_rate"):
        return f"{100 * value:.2f}"
    if key == "num_problems":
        return f"{value:g}"
    return f"{value:.1f}"


def _header(key: str) -> str:
    if key.startswith(("avg@", "pass@")) or key in ("mean_score", "truncation_rate"):
        return f"{key} (%)"
    if key == "mean_length":
        return "mean length (tokens)"
    return key


def markdown_table(results: Mapping[str, Mapping[str, float]], macro: bool = True) -> str:
    """Markdown table with a row per benchmark (and a macro-average row when ``macro`` and several benchmarks).

    Accuracies and rates are printed in percent; columns are the first benchmark's metric keys but ``k`` (it is in
    the avg@k header).
    """
    if not results:
        raise ValueError("markdown_table needs at least one benchmark's metrics.")
    rows = dict(results)
    if macro and len(rows) > 1:
        rows[MACRO_ROW] = macro_average(results)
    keys = [key for key in next(iter(results.values())) if key != "k"]
    lines = [
        "| benchmark | " + " | ".join(_header(k) for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for name, metrics in rows.items():
        cells = [_format(k, metrics[k]) if k in metrics else "" for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
