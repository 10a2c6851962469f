"""A finished study run as ``result.json`` (written last and atomically), shared by the testbed runs and the recipe
runs so that one table reads both; and reading results back, from the run folders and the grid's pack alike."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

from .pack import PACK, packed_ids, read_pack, run_file, run_order


def collapsed(rewards: list[tuple[int, float]], steps: int, tail: float = 0.2) -> bool:
    """True when the rollout reward fell to 0 and stayed there: every rollout of the last ``tail`` of the run, and
    at least the last two rollouts, has reward 0 (a run of 8 rollouts is judged on its last two)."""
    last = [r for s, r in rewards if s > (1 - tail) * steps]
    if len(last) < 2:
        last = [r for _, r in rewards[-2:]]
    return len(last) >= 2 and all(r == 0 for r in last)


def code_version() -> str | None:
    """The commit of the checkout the run's code came from (None outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_result(spec, run_dir: Path, evals: list[dict], start: float, code: str | None, **extra) -> dict:
    """Summarize a finished run (its ``metrics.jsonl`` and held-out ``evals``: ``{"step", "sampled", ...}`` from
    step 0 to the end) into ``result.json``, written last and atomically; returns the result. ``start`` and
    ``code``: the time and :func:`code_version` when the run started (a commit made during the run is not its code)."""
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [(e["step"], e["reward"]) for e in entries if isinstance(e.get("reward"), (int, float))]
    last = evals[-spec.last_evals:]
    angles = [e["grad/angle_deg"] for e in entries if isinstance(e.get("grad/angle_deg"), (int, float))]
    result = {
        "diagnostics": summarize_diagnostics(entries),
        "spec": spec.to_json(),
        "run_id": spec.run_id,
        "group": spec.group,
        "variant": spec.variant,
        "final_sampled": evals[-1]["sampled"],
        "final_greedy": evals[-1].get("greedy"),
        "last_evals_mean": sum(e["sampled"] for e in last) / len(last),
        "start_sampled": evals[0]["sampled"],
        "collapsed": collapsed(rewards, evals[-1]["step"]),
        "mean_angle_deg": sum(angles) / len(angles) if angles else None,
        "evals": evals,
        "rewards": rewards,
        "drift_guard": summarize_guard(entries),
        "seconds": time.time() - start,
        "code": code,
        **extra,
    }
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, run_dir / "result.json")
    return result


def summarize_guard(entries: list[dict]) -> dict | None:
    """A guarded run's drift guard (None for a run without one): the updates it applied and the rollouts it cut
    short in all, the updates each rollout took (a rollout starts at a step that logs the rollout ``reward``), and
    each decision (``[step, ratio_std, kl, bin-0 tokens, tokens, decided_by]``: the measures, None where one had no
    token, the tokens they rested on and how the decision was taken, ``drift_guard.OWN`` / ``FALLBACK`` /
    ``UNDECIDED``; the last three None for a run made before the guard logged them)."""
    guarded = [e for e in entries if isinstance(e.get("drift_guard/updates_applied"), (int, float))]
    if not guarded:
        return None
    per_rollout: list[int] = []
    for entry in guarded:
        if isinstance(entry.get("reward"), (int, float)) or not per_rollout:
            per_rollout.append(0)
        per_rollout[-1] = max(per_rollout[-1], int(entry["drift_guard/updates_in_rollout"]))

    def finite(value):
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None

    def count(value):
        return int(value) if finite(value) is not None else None

    measured = [[e["step"], finite(e.get("drift_guard/ratio_std")), finite(e.get("drift_guard/kl")),
                 count(e.get("drift_guard/bin0_tokens")), count(e.get("drift_guard/tokens")),
                 count(e.get("drift_guard/decided_by"))] for e in guarded
                if finite(e.get("drift_guard/ratio_std")) is not None or finite(e.get("drift_guard/kl")) is not None
                or finite(e.get("drift_guard/decided_by")) is not None]
    return {"updates_applied": int(guarded[-1]["drift_guard/updates_applied"]),
            "rollouts_cut": int(guarded[-1]["drift_guard/rollouts_cut"]),
            "updates_per_rollout": per_rollout, "measures": measured}


MAX_TRACKED = ("acpo_eps", "ratio_std", "clip_frac_pos", "clip_frac_neg", "moved_frac")


def summarize_diagnostics(entries: list[dict]) -> dict:
    """Run means of the diagnostics, small enough for ``result.json`` (so tables and cross-seed plots do not need
    ``metrics.jsonl``): ``bins[metric]["k,b"]``, ``bins_max`` (the largest value of one logged step, for the metrics
    of ``MAX_TRACKED``), ``grad_k[metric]["k"]`` (angle, norm ratio and shares per update index k),
    ``grad[metric]`` (shares, angle, over all k) and ``eps_rule``, the statistic of the bin rule behind ``acpo_eps`` (``"ratio"`` or ``"logratio"``), and ``eps_own``,
    whether that rule is the method's own (False: ACPO's, not applied)."""
    from ..diagnostics.plots import bin_table  # deferred: torch, which acpo_trl.diagnostics imports

    bins = {name: {f"{k},{b}": v for (k, b), v in cells.items()} for name, cells in bin_table(entries).items()}
    largest = {name: {f"{k},{b}": v for (k, b), v in cells.items()}
               for name, cells in bin_table(entries, reduce=max).items() if name in MAX_TRACKED}
    sums: dict = {}
    for entry in entries:
        for key, value in entry.items():
            if key.startswith("grad/") and isinstance(value, (int, float)) and math.isfinite(value):
                sums.setdefault(key, []).append(value)
    means = {key: sum(v) / len(v) for key, v in sums.items()}
    grad_k: dict = {}
    for key, value in means.items():
        parts = key.split("/")
        if _is_update_index(parts[1]):
            grad_k.setdefault("/".join(parts[2:]), {})[parts[1][1:]] = value
    logratio_rule = [e["diag/eps_rule_logratio"] for e in entries if "diag/eps_rule_logratio" in e]
    own_rule = [e["diag/eps_rule_own"] for e in entries if "diag/eps_rule_own" in e]
    return {"bins": bins, "bins_max": largest, "grad_k": grad_k,
            "grad": {k[5:]: v for k, v in means.items() if not _is_update_index(k.split("/")[1])},
            # the rule of `acpo_eps` (diagnostics.hook.diagnostics_rule); runs logged before it was recorded: "ratio"
            "eps_rule": "logratio" if logratio_rule and logratio_rule[-1] == 1 else "ratio",
            # whether `acpo_eps` is the method's own rule (runs logged before it was recorded: None)
            "eps_own": bool(own_rule[-1]) if own_rule else None}


def _is_update_index(part: str) -> bool:
    """Whether a metric-name part is an update index ``k{k}`` (``grad/k3/angle_deg``)."""
    return part[:1] == "k" and part[1:].isdigit()


def is_done(spec, out_dir: str | Path) -> bool:
    """Whether the cell ``spec`` is finished under ``out_dir``: its folder has ``result.json``, or the grid's pack
    holds it (pack.py)."""
    return (Path(out_dir) / "runs" / spec.run_id / "result.json").exists() or spec.run_id in packed_ids(out_dir)


def clip_free(result: dict) -> bool | None:
    """Whether no token with a nonzero advantage had its ratio outside GRPO's clip [0.8, 1.2] at any logged update
    of the run (``moved_frac``, diagnostics.ratio_stats): then no clip that contains [0.8, 1.2] would have bound on
    it. None: the run did not log ``moved_frac``."""
    moved = result.get("diagnostics", {}).get("bins_max", {}).get("moved_frac")
    return None if not moved else all(value == 0 for value in moved.values())


def finished_runs(out_dir: str | Path) -> dict[str, dict]:
    """Every finished run's result under ``out_dir`` by run id, in the order of the runs' folders: the packed runs
    (pack.py) and the folders under ``out_dir/runs`` with a ``result.json``. A folder wins over the packed run of
    its id, as packing again would have it (a run put back in its folder by hand, or rerun)."""
    runs = {run_id: record["result.json"] for run_id, record in read_pack(out_dir).items()}
    root = Path(out_dir) / "runs"
    runs.update({path.parent.relative_to(root).as_posix(): json.loads(path.read_text())
                 for path in root.glob("**/result.json")})
    return {run_id: runs[run_id] for run_id in sorted(runs, key=run_order)}


def load_results(out_dir: str | Path) -> list[dict]:
    """Every finished run's result under ``out_dir``, packed or in its folder (:func:`finished_runs`)."""
    return list(finished_runs(out_dir).values())


def read_result(out_dir: str | Path, run_id: str) -> dict:
    """One finished run's result, from its folder or the pack."""
    return json.loads(run_file(out_dir, run_id))


def has_runs(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` is a grid's folder: it has run folders or a pack."""
    return (Path(out_dir) / "runs").is_dir() or (Path(out_dir) / PACK).is_file()


def group_of(result: dict) -> str:
    """A result's table section: its task, with the learning rate when it is a drift level (results written before
    drift levels existed have no ``group``: their task)."""
    return result.get("group", result["spec"]["task"])
