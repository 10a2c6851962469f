"""The study's paper-style table from the runs' ``result.json`` files.

Per task and variant (method, or ACPO at an alpha of the sweep), per regime (updates per rollout):
mean +- sd over seeds of the final sampled accuracy and of the mean of the last evaluations; the relative drop
of the mean final accuracy from the nearest-on-policy regime (the smallest upr) to each off-policy one; the
average rank over the configurations (task x regime; 1 = best mean final accuracy); and, separately, the collapse
rate (runs whose reward fell to 0 and stayed there), and the runs that ended below their starting accuracy
(degraded without a full collapse). A second table repeats the accuracies without the collapsed
runs, so that a few collapses cannot hide what the other runs did.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

from ..training.drift_guard import FALLBACK, OWN, UNDECIDED
from .drift import k3_at_ratio_std
from .mechanism import mechanism_table
from .results import group_of
from .stats import bin_mean, clip_metric, difference_interval, mean, shown, summarize, t_interval


def _fmt(mean: float, sd: float, n: int) -> str:
    return "–" if n == 0 else f"{mean:.3f} ± {sd:.3f} (n={n})"


def variant_pairs_table(summary: dict) -> list[str]:
    """Per task and regime, every pair of variants, then every variant against itself at the fewest updates per
    rollout: the mean difference of their final accuracy over the seeds both ran, in points, with its seed-paired 95%
    bootstrap and t intervals and each seed's own difference; and how many comparisons the task's rows make."""
    lines = ["## Variants paired by seed", "",
             "Final sampled accuracy of the first variant minus the second's, in points (mean over the seeds both ran, "
             "each seed's two runs from the same model on the same prompts), with a 95% bootstrap interval "
             "resampling seeds with their pair of runs and a 95% paired t interval (at a handful of seeds the "
             "bootstrap is too narrow), and the difference of each seed in seed order; then each variant at more "
             "updates per rollout minus itself at the fewest (upr: more - fewest; the regimes sample as many "
             "completions). No interval is adjusted for the number of comparisons a task makes (its last line).", "",
             "| task | upr | first - second | difference [95% bootstrap] | paired t [95%] | seeds | per seed |",
             "|---|---|---|---|---|---|---|"]

    def row(task, upr, label, a, b):
        seeds = sorted(a.keys() & b.keys())
        if seeds:
            per_seed = [a[s] - b[s] for s in seeds]
            lines.append(f"| {task} | {upr} | {label} | {100 * sum(per_seed) / len(seeds):+.1f}"
                         f"{_interval(difference_interval(a, b))} |{_interval(t_interval(a, b))} | {len(seeds)} | "
                         f"{', '.join(f'{100 * d:.1f}' for d in per_seed)} |")
            return 1
        return 0

    counts = []
    for task, data in summary.items():
        variants, fewest = sorted(data["rows"]), min(data["uprs"])
        by_seed = {(v, upr): data["rows"][v]["regimes"][upr]["by_seed"] for v in variants for upr in data["uprs"]}
        made = 0
        for upr in data["uprs"]:
            for i, first in enumerate(variants):
                for second in variants[i + 1:]:
                    made += row(task, upr, f"`{first}` - `{second}`", by_seed[(first, upr)], by_seed[(second, upr)])
        for variant in variants:
            for upr in data["uprs"]:
                if upr != fewest:
                    made += row(task, f"{upr} - {fewest}", f"`{variant}`", by_seed[(variant, upr)],
                                by_seed[(variant, fewest)])
        counts.append(f"{task}: {made}")
    return lines + ["", "Comparisons per task (rows above): " + ", ".join(counts) + ".", ""]


def _interval(bounds: tuple[float, float]) -> str:
    """`` [lo, hi]`` in points, or nothing for an interval that one seed cannot give."""
    lo, hi = bounds
    return "" if math.isnan(lo) else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def match_verdict(to_reference: tuple[float, float], to_baseline: tuple[float, float]) -> str:
    """The ablation's rule (docs/RESULTS.md, "Why ACPO wins"), from the 95% intervals of a variant's paired
    difference to ACPO alpha 3 (the reference) and to DAPO (the baseline): it *matches* ACPO alpha 3 when the first
    holds 0 and the second lies above 0; below it when the first lies below 0, placed against DAPO likewise."""
    (ref_lo, ref_hi), (base_lo, base_hi) = to_reference, to_baseline
    if math.isnan(ref_lo) or math.isnan(base_lo):
        return "too few seeds"
    against_dapo = "above DAPO" if base_lo > 0 else "below DAPO" if base_hi < 0 else "not told apart from DAPO"
    if ref_lo > 0:
        return f"above ACPO alpha 3, {against_dapo}"
    if ref_hi < 0:
        return f"below ACPO alpha 3, {against_dapo}"
    return "matches ACPO alpha 3" if base_lo > 0 else f"not told apart from ACPO alpha 3, {against_dapo}"


def ablation_table(results: list[dict], summary: dict, hypotheses: dict[str, str], reference: str = "acpo",
                   baseline: str = "dapo") -> list[str]:
    """Per task and regime where the ablation ran: each variant of ``hypotheses`` ({row: hypothesis}) against the
    reference (ACPO alpha 3) and the baseline (DAPO), paired by seed, with :func:`match_verdict`, and the method's
    own clip fraction per bin and advantage sign (the references' too)."""
    diagnosed: dict = defaultdict(list)
    for r in results:
        if r.get("diagnostics"):
            diagnosed[(group_of(r), r["variant"], r["spec"]["upr"])].append(r)

    def clip_shares(task, variant, upr):
        runs = diagnosed.get((task, variant, upr))
        if not runs:
            return "– | –"
        return " | ".join(" / ".join(_pct(bin_mean(runs, clip_metric(runs, sign), b)) for b in range(5))
                          for sign in ("neg", "pos"))

    rows = []
    for task, data in summary.items():
        if reference not in data["rows"] or baseline not in data["rows"]:
            continue
        for upr in data["uprs"]:
            ref = data["rows"][reference]["regimes"][upr]["by_seed"]
            base = data["rows"][baseline]["regimes"][upr]["by_seed"]
            ran = [(v, h) for v, h in hypotheses.items()
                   if data["rows"].get(v, {}).get("regimes", {}).get(upr, {}).get("by_seed")]
            if not ran:
                continue
            for variant, name in ((reference, "reference"), (baseline, "reference")):
                rows.append(f"| {task} | {upr} | {name} | `{variant}` | – | – | – | {clip_shares(task, variant, upr)} |")
            for variant, hypothesis in ran:
                runs = data["rows"][variant]["regimes"][upr]["by_seed"]
                cells, intervals = [], []
                for other in (ref, base):
                    seeds = sorted(runs.keys() & other.keys())
                    interval = difference_interval(runs, other)
                    intervals.append(interval)
                    mean = sum(runs[s] - other[s] for s in seeds) / len(seeds) if seeds else math.nan
                    ci = "" if math.isnan(interval[0]) else f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"
                    cells.append(f"{100 * mean:+.1f}{ci} ({len(seeds)})")
                rows.append(f"| {task} | {upr} | {hypothesis} | `{variant}` | {cells[0]} | {cells[1]} | "
                            f"{match_verdict(*intervals)} | {clip_shares(task, variant, upr)} |")
    if not rows:
        return []
    return ["## The ablation", "",
            f"Each variant's final sampled accuracy minus ACPO alpha 3's (`{reference}`) and DAPO's (`{baseline}`), in "
            "points, mean over the seeds both ran (how many in parentheses) with a 95% bootstrap "
            "interval pairing seeds. The rule, fixed before the verdicts: a variant matches ACPO alpha 3 when its "
            "interval against ACPO alpha 3 holds 0 and its interval against DAPO lies above 0. Clip %: the method's "
            "own clip fraction per current-probability bin (0 = least likely), by advantage sign, means over seeds "
            "and over updates k >= 1 of a rollout.", "",
            "| task | upr | hypothesis | variant | - ACPO alpha 3 [95% CI] (seeds) | - DAPO [95% CI] (seeds) | verdict "
            "| clip % A<0, bins 0..4 | clip % A>0, bins 0..4 |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def _difference(a: dict[int, float], b: dict[int, float]) -> str:
    """``a - b`` over their common seeds in points, with its paired 95% interval (none from one seed)."""
    seeds = sorted(a.keys() & b.keys())
    if not seeds:
        return "–"
    lo, hi = difference_interval(a, b)
    ci = "" if math.isnan(lo) else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"{100 * sum(a[s] - b[s] for s in seeds) / len(seeds):+.1f}{ci}"


def _guard_options(result: dict) -> dict:
    return {name: value for name, value in result["spec"].get("options") or () if name.startswith("drift_guard")}


GUARD_HEADER = [
    "## The drift guard", "",
    "Guarded runs against the same method's unguarded runs of the same seeds (the same prompts and sampled "
    "completions per rollout). Differences of final sampled accuracy in points, mean over seeds [95% "
    "bootstrap interval over seeds]. Cut: rollouts the guard cut short, of all rollouts. Steps applied: "
    "optimizer updates applied, of the run's steps (a skipped update still counts as a step). On <= 1 "
    "bin-0 token: decisions whose mini-batch held at most one bin-0 token (a ratio std of exactly 0 or "
    "none), of all decisions. Decided on: decisions taken on the guard's own measure / on the k3 fallback "
    "/ on too few tokens for either (update applied), for runs with the token rule (drift_guard.py). "
    "Last rollout: the mean updates the runs' last rollout took. Wall: mean "
    "seconds per run, guarded / unguarded.", "",
    "| task | variant | upr | guard | seeds | final acc | - unguarded, same upr | - unguarded, fewest upr | "
    "collapsed (guarded / unguarded) | cut | steps applied | updates per rollout (mean) | on <= 1 bin-0 "
    "token | decided on own / fallback / none | last rollout | wall s |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def guard_table(results: list[dict]) -> list[str]:
    """The drift guard's runs, per level and method, paired by seed with the same method's unguarded runs (same
    alpha and clip, no other option): the final accuracy difference to the unguarded runs in the same regime and
    to those at the smallest number of updates per rollout, with 95% intervals; collapses; how often the guard cut
    a rollout short and the optimizer steps it applied; the wall time per run. Then each pair of guard rules run
    on the same method and regime, against each other by seed."""
    guarded = [r for r in results if r.get("drift_guard")]
    if not guarded:
        return []
    groups = defaultdict(list)
    for r in guarded:
        spec, guard = r["spec"], _guard_options(r)
        rule = (f"{guard.get('drift_guard')} > {guard.get('drift_guard_threshold')}"
                + (f" on >= {guard['drift_guard_min_tokens']} tokens" if "drift_guard_min_tokens" in guard else ""))
        groups[(group_of(r), spec["method"], spec.get("alpha"), json.dumps(spec.get("clip")), spec["upr"], rule)].append(r)
    lines, arms = list(GUARD_HEADER), defaultdict(dict)
    for key, runs in sorted(groups.items(), key=lambda kv: kv[0][:2] + kv[0][4:]):
        *cell, rule = key
        arms[tuple(cell)][rule] = {r["spec"]["seed"]: r["final_sampled"] for r in runs}
        lines.append(_guard_row(key, runs, results))
    return lines + [""] + _guard_rules_table(arms) + _k3_lines(guarded, results) + [""]


def _guard_row(key: tuple, runs: list[dict], results: list[dict]) -> str:
    """One row of :func:`guard_table`: a guard rule's runs of one method and regime against the unguarded ones."""
    group, method, alpha, clip, upr, rule = key
    plain = [r for r in results if group_of(r) == group and r["spec"]["method"] == method
             and r["spec"].get("alpha") == alpha and json.dumps(r["spec"].get("clip")) == clip
             and not r["spec"].get("options")]
    near_upr = min((r["spec"]["upr"] for r in plain), default=upr)
    by_seed = {r["spec"]["seed"]: r["final_sampled"] for r in runs}
    same = {r["spec"]["seed"]: r for r in plain if r["spec"]["upr"] == upr}
    near = {r["spec"]["seed"]: r["final_sampled"] for r in plain if r["spec"]["upr"] == near_upr}
    steps = sum(r["spec"]["steps"] for r in runs)
    rollouts = sum(len(r["drift_guard"]["updates_per_rollout"]) for r in runs)
    taken = [n for r in runs for n in r["drift_guard"]["updates_per_rollout"]]
    unguarded_same = [same[s] for s in sorted(same) if s in by_seed]
    measured = [m for r in runs for m in r["drift_guard"]["measures"]]
    few = sum((m[3] <= 1) if len(m) > 3 and m[3] is not None else m[1] in (None, 0.0) for m in measured)
    ways = [sum(len(m) > 5 and m[5] == way for m in measured) for way in (OWN, FALLBACK, UNDECIDED)]
    decided = " / ".join(map(str, ways)) if any(len(m) > 5 and m[5] is not None for m in measured) else "–"
    last = mean([r["drift_guard"]["updates_per_rollout"][-1] for r in runs])
    return (f"| {group} | `{method}` | {upr} | {rule} | {len(runs)} | {mean(list(by_seed.values())):.3f} | "
            f"{_difference(by_seed, {s: r['final_sampled'] for s, r in same.items()})} | "
            f"upr {near_upr}: {_difference(by_seed, near)} | "
            f"{sum(r['collapsed'] for r in runs)}/{len(runs)} / "
            f"{sum(r['collapsed'] for r in unguarded_same)}/{len(unguarded_same)} | "
            f"{sum(r['drift_guard']['rollouts_cut'] for r in runs)}/{rollouts} | "
            f"{sum(r['drift_guard']['updates_applied'] for r in runs)}/{steps} | {mean(taken):.1f} | "
            f"{few}/{len(measured)} | {decided} | {last:.1f} | "
            f"{mean([r['seconds'] for r in runs]):.0f} / {mean([r['seconds'] for r in unguarded_same]):.0f} |")


def _guard_rules_table(arms: dict) -> list[str]:
    """Each pair of guard rules run on the same method and regime, against each other by seed."""
    pairs = [(key, a, b) for key, rules in sorted(arms.items(), key=lambda kv: kv[0][:2] + kv[0][4:])
             for a, b in combinations(sorted(rules), 2) if rules[a].keys() & rules[b].keys()]
    if not pairs:
        return []
    lines = ["Guard rules against each other (same method and regime, paired by seed; points, mean [95% "
             "interval]):", "", "| task | variant | upr | guard | - guard | difference | seeds |",
             "|---|---|---|---|---|---|---|"]
    for key, a, b in pairs:
        (group, method, _, _, upr), first, second = key, arms[key][a], arms[key][b]
        lines.append(f"| {group} | `{method}` | {upr} | {a} | {b} | {_difference(first, second)} | "
                     f"{len(first.keys() & second.keys())} |")
    return lines + [""]


def _k3_lines(guarded: list[dict], results: list[dict]) -> list[str]:
    """Per task with guarded runs, the k3 that goes with a bin-0 ratio std of 0.3 in its unguarded runs."""
    lines = []
    for task in sorted({r["spec"]["task"] for r in guarded}):
        found = k3_at_ratio_std([r for r in results if r["spec"]["task"] == task])
        if found["runs"]:
            lines.append(f"The k3 that goes with a bin-0 ratio std of 0.3 on {task} (`drift_guard.KL_THRESHOLD`, "
                         "`study/drift.py::k3_at_ratio_std`): median {:.3f} over the {} unguarded runs at 16 updates "
                         "per rollout whose run-mean bin-0 std reaches 0.3 ({} never do), at the first update index "
                         "that does.".format(found["median"], len(found["runs"]), found["never"]))
    return lines


def overall_table(summary: dict) -> list[str]:
    """Across tasks (the paper's summary): each variant's average rank over every (task, regime) configuration
    it ran in, and its drop from the nearest-on-policy to the most off-policy regime per task."""
    tasks = list(summary)
    variants = sorted({v for data in summary.values() for v in data["rows"]})
    rows = []
    for v in variants:
        ranks = [r for data in summary.values() for r in data["rows"].get(v, {}).get("ranks", [])]
        drops = []
        for task in tasks:
            data = summary[task]
            row = data["rows"].get(v)
            drops.append(row["drop"].get(data["uprs"][-1], math.nan) if row and len(data["uprs"]) > 1 else math.nan)
        rows.append((sum(ranks) / len(ranks) if ranks else math.nan, v, len(ranks), drops))
    head = ["variant", "configurations", "avg rank"] + [f"drop, {t}" for t in tasks] + ["mean drop"]
    lines = ["### All tasks", "", "Average rank over every (task, regime) configuration the variant ran in; drop from "
             "the nearest-on-policy to the most off-policy regime of each task.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, v, n, drops in sorted(rows, key=lambda x: (x[0], x[1])):
        cols = [f"`{v}`", str(n), f"{rank:.2f}"] + [shown(100 * d, "+.1f", "%") for d in drops + [mean(drops)]]
        lines.append("| " + " | ".join(cols) + " |")
    return lines + [""]


def _task_table(task: str, data: dict, with_collapse: bool) -> list[str]:
    uprs = data["uprs"]
    head = ["variant"] + [f"final acc, upr {u}" for u in uprs] + [f"last-evals mean, upr {u}" for u in uprs]
    head += [f"drop {uprs[0]}→{u}" for u in uprs[1:]] + ["avg rank"]
    if with_collapse:
        head += ["collapsed", "ended below start"]
    lines = [f"### {task}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = sorted(data["rows"], key=lambda v: (data["rows"][v]["avg_rank"], v))
    for v in order:
        row = data["rows"][v]
        regimes = row["regimes"]
        cols = [f"`{v}`"]
        cols += [_fmt(*regimes[u]["final"], regimes[u]["n"]) for u in uprs]
        cols += [_fmt(*regimes[u]["last"], regimes[u]["n"]) for u in uprs]
        cols += [_drop(row["drop"][u], row["drop_ci"][u]) for u in uprs[1:]]
        cols += [f"{row['avg_rank']:.2f}"]
        if with_collapse:
            cols += [" / ".join(f"{regimes[u]['collapsed']}/{regimes[u]['runs']}" for u in uprs)]
            cols += [" / ".join(f"{regimes[u]['below_start']}/{regimes[u]['runs']}" for u in uprs)]
        lines.append("| " + " | ".join(cols) + " |")
    return lines + [""]


def _drop(drop: float, interval: tuple[float, float]) -> str:
    if math.isnan(drop):
        return "–"
    lo, hi = interval
    return f"{100 * drop:+.1f}%" + ("" if math.isnan(lo) else f" [{100 * lo:+.0f}, {100 * hi:+.0f}]")


def own_eps(result: dict, k: int, b: int) -> tuple[float, str]:
    """The eps of the run's own bin rule at update k and bin b, and the rule that column shows: ``acpo_eps`` where
    the diagnostics logged the run's own rule (``eps_rule``); for an ``acpo_log`` run logged before the rule was
    recorded (its ``acpo_eps`` is ACPO's ratio rule), eps = clamp(base + alpha x log-ratio std, min, max) from the
    run-mean log-ratio std, an approximation ("≈": the mean of the per-micro-batch rule, not the rule of the mean)."""
    diags, spec = result["diagnostics"], result["spec"]
    rule = diags.get("eps_rule", "ratio")
    value = diags["bins"].get("acpo_eps", {}).get(f"{k},{b}")
    if spec["method"] == "acpo_log" and rule == "ratio":
        std = diags["bins"].get("logratio_std", {}).get(f"{k},{b}")
        low, high = spec.get("clip") or (0.0, 3.0)
        alpha = 3.0 if spec.get("alpha") is None else spec["alpha"]
        value = None if std is None else min(max(0.2 + alpha * math.sqrt(std**2 + 1e-8), low), high)
        return (math.nan if value is None else value), "acpo_log's own ≈"
    own = diags.get("eps_own")
    if own is None:  # a run logged before the diagnostics recorded it: ACPO's and acpo_log's rules were their own
        own = spec["method"] in ("acpo", "acpo_log")
    value = math.nan if value is None else value
    if not own:
        return value, "ACPO's (not applied)"
    if spec["method"] == "bin_clip":
        return value, "own (frozen)"
    return value, f"own ({'log-ratio' if rule == 'logratio' else 'ratio'})"


def _pct(x: float) -> str:
    return shown(100 * x, ".2f" if 0 < 100 * x < 1 else ".1f")


def diagnostics_table(results: list[dict]) -> list[str]:
    """Per task, variant and regime, means over seeds (and over the update indices k >= 1 of a rollout): the eps of
    the run's bin rule in each bin (:func:`own_eps`: the method's own for ACPO and ``acpo_log``, what ACPO would set
    for the others), the method's clip fraction in the lowest and highest bins by advantage sign (for bin 0's A < 0
    tokens also the largest run mean at one update index), the gradient angle to the unclipped surrogate, and the
    gradient share of the low-probability bins 0-1."""
    cells: dict = defaultdict(list)
    for r in results:
        if r.get("diagnostics"):
            cells[(group_of(r), r["variant"], r["spec"]["upr"])].append(r)
    if not cells:
        return []

    def largest(values):
        values = [v for v in values if v is not None and math.isfinite(v)]
        return max(values) if values else math.nan

    by_bin, pct = bin_mean, _pct
    lines = ["## Diagnostics (means over seeds and over updates k >= 1 of a rollout)", "",
             "eps: the bin rule's range per bin, the run's own for ACPO, `acpo_log` and `bin_clip` (own (ratio): std "
             "of r; own (log-ratio): std of log r; own (frozen): `bin_clip_ranges`; acpo_log's own ≈: computed from "
             "the logged log-ratio std for runs made before the diagnostics recorded acpo_log's rule, see "
             "`table.own_eps`), and for the other methods (and a run binned otherwise than its method, e.g. a 1-bin "
             "ACPO) the range ACPO at alpha 3 would set (not applied). Clip %: the method's own clip masks (CISPO: its trust-region mask). "
             "Bin-0 A<0 largest: the largest run mean at one update index k.", "",
             "| task | variant | upr | eps bins 0..4 | eps rule | clip % A>0 bin 0 / 4 | clip % A<0 bin 0 / 4 | "
             "bin-0 A<0 clip % largest | log-ratio std bin 0 / 4 | angle to unclipped (k >= 1) | "
             "grad share bins 0-1 (A>0 / A<0) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (task, variant, upr), runs in sorted(cells.items()):
        diags = [r["diagnostics"] for r in runs]
        eps_cells = {(r["run_id"], k, b): own_eps(r, k, b) for r in runs
                     for k in {int(kb.split(",")[0]) for kb in r["diagnostics"]["bins"].get("logratio_std", {})}
                     if k >= 1 for b in range(5)}
        eps = " / ".join(f"{mean([v for (_, _, bb), (v, _) in eps_cells.items() if bb == b]):.2f}" for b in range(5))
        rule = ", ".join(sorted({name for _, name in eps_cells.values()})) or "–"
        clip = lambda m: f"{pct(by_bin(runs, m, 0))} / {pct(by_bin(runs, m, 4))}"  # noqa: E731
        pos, neg = clip_metric(runs, "pos"), clip_metric(runs, "neg")
        std = f"{by_bin(runs, 'logratio_std', 0):.3f} / {by_bin(runs, 'logratio_std', 4):.3f}"
        angle = mean([v for d in diags for k, v in d["grad_k"].get("angle_deg", {}).items() if int(k) >= 1])
        share = [mean([sum(d["grad"].get(f"share/bin{b}/{s}", math.nan) for b in (0, 1)) for d in diags])
                 for s in ("pos", "neg")]
        lines.append(f"| {task} | `{variant}` | {upr} | {eps} | {rule} | {clip(pos)} | {clip(neg)} | "
                     f"{pct(by_bin(runs, neg, 0, largest))} | {std} | "
                     f"{'–' if math.isnan(angle) else f'{angle:.1f}°'} | "
                     f"{'–' if all(map(math.isnan, share)) else f'{share[0]:.2f} / {share[1]:.2f}'} |")
    return lines + [""]


def identical_runs_table(results: list[dict]) -> list[str]:
    """Per group and regime, the seeds whose runs of every variant have the same outcome: the same held-out
    evaluations and rollout rewards at every step. Where nothing clips, the variants make the same updates and cannot
    differ by construction; the weights may still differ by rounding (another loss path) or by a few clipped tokens
    too small to change a sampled completion, so this is identity of outcome, not of weights."""
    blocks: dict = defaultdict(list)
    for r in results:
        if "evals" in r:
            blocks[(group_of(r), r["spec"]["upr"], r["spec"]["seed"])].append(json.dumps([r["evals"], r["rewards"]]))
    rows: dict = defaultdict(lambda: [0, 0, 0])
    for (group, upr, _), runs in blocks.items():
        if len(runs) < 2:
            continue
        row = rows[(group, upr)]
        row[0] += 1
        row[1] += len(set(runs)) == 1
        row[2] += len(set(runs)) < len(runs)
    if not rows:
        return []
    lines = ["## Identical runs", "", "Seeds whose runs have the same outcome across variants (the same evaluations and "
             "rollout rewards at every step), per group and regime: where no method's clip binds, the variants make the "
             "same updates. Same outcome, not same weights: a loss path that rounds differently, or a few clipped tokens, "
             "can change the weights without changing a sampled completion.", "",
             "| task | upr | seeds | all variants identical | some variants identical |", "|---|---|---|---|---|"]
    for (group, upr), (seeds, every, some) in sorted(rows.items()):
        lines.append(f"| {group} | {upr} | {seeds} | {every} | {some} |")
    return lines + [""]


def testbeds_table(results: list[dict]) -> list[str]:
    """Per group, the warm-ups the runs started from (a machine whose kernels round differently trains another
    one: another testbed; `acpo-study run` keeps each block of a level and a seed on one), with their seeds and
    mean step-0 held-out accuracy; where a group holds several, each variant's drop on each warm-up alone."""
    cells: dict = defaultdict(list)
    for r in results:
        recipe = r["spec"].get("recipe")
        start = r.get("warmup_digest") or (f"`model_name_or_path` of {recipe}" if recipe else "not recorded")
        cells[(group_of(r), start)].append(r)
    lines = ["## Testbeds (the warm-up each run started from)", "",
             "| task | warm-up | seeds | runs | step-0 sampled accuracy |", "|---|---|---|---|---|"]
    for (task, digest), runs in sorted(cells.items()):
        seeds = ", ".join(str(s) for s in sorted({r["spec"]["seed"] for r in runs}))
        lines.append(f"| {task} | {digest} | {seeds} | {len(runs)} | {mean([r['start_sampled'] for r in runs]):.3f} |")
    split = sorted(t for t, n in Counter(t for t, _ in cells).items() if n > 1)
    if split:
        lines += ["", "Drop from the smallest to the largest upr on each warm-up alone (number of seeds):", "",
                  "| task | variant | drop per warm-up |", "|---|---|---|"]
        for task in split:
            per_warmup = {d: summarize(runs)[task] for (t, d), runs in sorted(cells.items()) if t == task}
            for variant in sorted({v for data in per_warmup.values() for v in data["rows"]}):
                parts = []
                for digest, data in per_warmup.items():
                    row, far = data["rows"].get(variant), data["uprs"][-1]
                    drop = row["drop"].get(far, math.nan) if row else math.nan
                    if math.isfinite(drop):  # seeds of this variant in both regimes on this warm-up
                        parts.append(f"{digest}: {100 * drop:+.1f}% ({row['regimes'][far]['n']})")
                lines.append(f"| {task} | `{variant}` | {' · '.join(parts) or '–'} |")
    return lines + [""] + starts_table(results)


def starts_table(results: list[dict]) -> list[str]:
    """Per group, variant and regime: the seeds that started from each checkpoint (recipe cells that record one)
    and the runs that resumed from a checkpoint after a session's end, with the steps they resumed at."""
    cells: dict = defaultdict(list)
    for r in results:
        if r["spec"].get("recipe"):
            cells[(group_of(r), r["variant"], r["spec"]["upr"])].append(r)
    if not cells:
        return []
    lines = ["Each cell's starts and resumptions (the start: the digest of the checkpoint a run started from, "
             "\"recipe\" where none was recorded; resumed: seed at steps):", "",
             "| task | variant | upr | starts (seeds) | resumed |", "|---|---|---|---|---|"]
    for (task, variant, upr), runs in sorted(cells.items()):
        starts: dict = defaultdict(list)
        for r in runs:
            starts[r.get("warmup_digest") or "recipe"].append(r["spec"]["seed"])
        resumed = [f"{r['spec']['seed']} at {', '.join(map(str, r['resumed_at']))}"
                   for r in sorted(runs, key=lambda r: r["spec"]["seed"]) if r.get("resumed_at")]
        lines.append(f"| {task} | `{variant}` | {upr} | "
                     + "; ".join(f"{d}: {', '.join(map(str, sorted(seeds)))}" for d, seeds in sorted(starts.items()))
                     + f" | {'; '.join(resumed) or '–'} |")
    return lines + [""]


def write_table(results: list[dict], path: str | Path | None = None, hypotheses: dict[str, str] | None = None) -> str:
    """The Markdown tables (all runs; then without the collapsed ones; the ablation's verdicts for the variants of
    ``hypotheses``, {row: hypothesis}); written to ``path`` when given."""

    lines = [
        "## Results of the study grid",
        "",
        "Final sampled accuracy (T = 1, held-out problems) and the mean over the last evaluations: mean ± sd over "
        "seeds. Drop: relative change of the mean final accuracy from the smallest to each larger number of updates "
        "per rollout (positive = worse off-policy), over the seeds both regimes ran. Avg rank: over the regimes of the "
        "task (1 = best; tied means share their mean rank). Collapsed: runs whose rollout reward fell to 0 and stayed "
        "there, per regime. Ended below "
        "start: runs, not collapsed, whose final sampled accuracy is below their step-0 accuracy (degraded without a "
        "full collapse). In brackets: 95% bootstrap interval of the drop, pairing the two regimes by seed (a seed's "
        "runs start from the same model and see the same prompts; seeds are resampled with their pair of runs).",
        "",
    ]
    everything = summarize(results)
    for task, data in everything.items():
        lines += _task_table(task, data, with_collapse=True)
    if len(everything) > 1:
        lines += overall_table(everything)
    if any(r["collapsed"] for r in results):
        lines += ["## Without the collapsed runs", ""]
        for task, data in summarize(results, exclude_collapsed=True).items():
            lines += _task_table(task, data, with_collapse=False)
    lines += variant_pairs_table(everything)
    lines += ablation_table(results, everything, hypotheses or {})
    lines += guard_table(results)
    lines += diagnostics_table(results)
    lines += mechanism_table(results)
    lines += identical_runs_table(results)
    lines += testbeds_table(results)
    text = "\n".join(lines)
    if path is not None:
        Path(path).write_text(text)
    return text
