"""The text a run leaves about itself: ``report.md`` (``acpo-train --report``), the model card's section on ACPO's
settings, the drift guard's line in both, and the one log line a run says when ACPO's lower clip goes void."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..losses.table import method_fields
from .drift_guard import FALLBACK, KL_THRESHOLD, OWN, UNDECIDED, DriftGuard

if TYPE_CHECKING:  # for the annotations only: the config imports TRL
    from ..config import ACPOConfig


def guard_summary(args, updates_applied: int, rollouts_cut: int, steps: int) -> str:
    """One line on the guard for a report or model card: its rule and how often it acted in ``steps`` steps."""
    if args.drift_guard is None:
        return "off"
    rollouts = math.ceil(steps / args.updates_per_rollout) if steps else 0
    return (f"{args.drift_guard} > {args.drift_guard_threshold:g}: cut {rollouts_cut} of {rollouts} rollouts short, "
            f"{updates_applied} of {steps} updates applied")


def guard_rule(args) -> str:
    """The guard's decision rule in words (its token rule: acpo_trl/training/drift_guard.py)."""
    if args.drift_guard == "kl":
        return f"kl > {args.drift_guard_threshold:g} on >= {args.drift_guard_min_tokens} tokens"
    fallback = KL_THRESHOLD if args.drift_guard_fallback_threshold is None else args.drift_guard_fallback_threshold
    return (f"ratio_std > {args.drift_guard_threshold:g} on >= {args.drift_guard_min_tokens} bin-0 tokens, else kl > "
            f"{fallback:g}")


def decisions_text(args, counts) -> str:
    """The guard's rule and how its decisions were taken: ``counts`` = (on its own measure, on the k3 fallback, on
    too few tokens)."""
    own, on_fallback, undecided = counts
    return (f"{guard_rule(args)}; {own} decided on {args.drift_guard}, {on_fallback} on the kl fallback, {undecided} on too few "
            "tokens (update applied)")


def write_report(path: str, script_args, training_args, model_name: str, before: dict, after: dict,
                 wall_s: float, entries: list[dict]) -> str:
    """A short Markdown report: held-out metrics before and after training, and the final clip ranges."""
    keys = sorted(k for k in after if k.startswith("eval/") and not k.endswith("/num_problems"))
    lines = [
        f"# acpo-train report: {script_args.task}",
        "",
        f"- model: `{model_name}`; policy loss: `{training_args.policy_loss}`; "
        f"{training_args.updates_per_rollout:g} optimizer updates per rollout",
        f"- steps: {entries[-1]['step'] if entries else 0}; wall time: {wall_s / 60:.1f} min",
        f"- held-out: {script_args.num_eval_tasks} problems, k = {script_args.eval_k} samples each at "
        f"T = {script_args.eval_temperature} ({script_args.eval_sampler} sampler)",
        "",
        "| metric | before | after |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {before.get(k, float('nan')):.4f} | {after[k]:.4f} |" for k in keys]
    if training_args.drift_guard is not None:
        last = next((e for e in reversed(entries) if e.get("drift_guard/updates_applied") is not None), {})
        decided = [e["drift_guard/decided_by"] for e in entries if isinstance(e.get("drift_guard/decided_by"), (int, float))]
        lines += ["", "Drift guard: " + guard_summary(training_args, int(last.get("drift_guard/updates_applied", 0)),
                                                      int(last.get("drift_guard/rollouts_cut", 0)),
                                                      entries[-1]["step"] if entries else 0),
                  "Its decisions: " + decisions_text(training_args, [decided.count(way) for way in (OWN, FALLBACK,
                                                                                                     UNDECIDED)])]
    if any((value or 0) > 1 for e in entries for key, value in e.items() if key.startswith("acpo/bin")
           and key.endswith("/eps")):
        lines += ["", LOWER_CLIP_VOID]
    last_eps = next((e for e in reversed(entries) if any(k.endswith("/eps") for k in e)), None)
    if last_eps:
        eps = {k: v for k, v in last_eps.items() if k.startswith("acpo/bin") and k.endswith("/eps")}
        lines += ["", "Clip range per probability bin at the last logged step: "
                  + ", ".join(f"{k.split('/')[1]} {v:.3f}" if v is not None else f"{k.split('/')[1]} -"
                              for k, v in sorted(eps.items()))]
    text = "\n".join(lines) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text


# What the guard did in the study (docs/RESULTS.md, "The guard on enough tokens"; acpo-study report --out study/smollm2)
GUARD_MEASURED = ("| drift guard, as measured | SmolLM2-135M, 16 updates per rollout, ratio_std at 0.3 with the token rule, "
                  "8 seeds: at lr 1e-6 it cut 1-6 of 128 rollouts and ended where unguarded runs did; at lr 2e-5 it "
                  "collapsed 2 of 8 runs (unguarded 3-5) and ended 48-54 points below 2 updates per rollout; kl at 0.07 "
                  "decided alike |")


def acpo_card_section(args: ACPOConfig, task: str | None, guard: DriftGuard | None = None, steps: int = 0) -> str:
    """The model card's training-method section for ``args`` (Markdown), with how often the drift guard acted in
    ``steps`` optimizer steps."""
    upr = args.updates_per_rollout
    regime = "on-policy (one update per rollout)" if args.is_on_policy else (
        "near on-policy" if upr <= 2 else "off-policy"
    )
    lines = [
        "## ACPO training settings",
        "",
        f"Trained with `acpo_trl`'s ACPOTrainer, policy loss `{args.policy_loss}`. ACPO (arXiv 2606.22570) clips the",
        "importance ratio of each token within a range set per bin of the current token probability:",
        "eps_b = clamp(epsilon + alpha * std_b, min, max), std_b the within-bin std of the ratio.",
        "",
        "| setting | value |",
        "|---|---|",
        f"| policy loss | `{args.policy_loss}` |",
        "| its fields | " + (method_fields(args.method, args) if args.method is not None else
                             f"TRL's own objective: `loss_type` {args.loss_type}, `epsilon` {args.epsilon}, "
                             f"`epsilon_high` {args.epsilon_high}") + " |",
        f"| loss aggregation | `{args.loss_type}` |",
        f"| regime | {regime}: {upr:g} optimizer updates per rollout |",
        "| drift guard | " + (guard_summary(args, guard.updates_applied, guard.rollouts_cut, steps) if guard else "off")
        + " |",
        *([f"| drift guard's decisions | {decisions_text(args, guard.state.decisions)} |", GUARD_MEASURED] if guard else []),
        f"| completions per prompt | {args.num_generations} |",
        f"| learning rate | {args.learning_rate} |",
        f"| task | {task or 'unspecified'} |",
    ]
    return "\n".join(lines) + "\n"


# What a void lower clip means and what to do, for report.md and the docs (the console says one line).
LOWER_CLIP_VOID = (
    "ACPO's lower clip was void at some update: eps > 1 in a probability bin, so 1 - eps < 0 and only the dual clip "
    "(dual_clip_c) bounds that bin's negative-advantage tokens. Where the ratio drifts this far, ACPO at alpha 3 "
    "degraded most on the testbed (docs/RESULTS.md, \"The drift map\"): fewer updates per rollout, a lower learning "
    "rate or acpo_clip_max < 1 (the authors' 0.5) keep it. The drift guard (drift_guard: ratio_std, "
    "drift_guard_threshold: 0.3) stops a rollout's updates past that drift, but on SmolLM2-135M at such drift it ended "
    "~50 points below 2 updates per rollout (docs/RESULTS.md, \"A drift guard\"): lower the drift rather than guard it."
)


def lower_clip_void_message(bins: list[int], eps: list[float], update: int, updates: int, step: int,
                            dual_clip_c: float | None) -> str:
    """The once-per-run console line for the first update at which ACPO's eps passes 1 in ``bins`` (its lower clip
    1 - eps is then below 0 and bounds nothing): which bins, at which update of a rollout, and where to read more
    (``LOWER_CLIP_VOID``, in report.md)."""
    bound = f"only the dual clip (c = {dual_clip_c:g})" if dual_clip_c is not None else "nothing (no dual clip)"
    return (f"ACPO's lower clip is void: eps > 1 in bin(s) {', '.join(map(str, bins))} "
            f"({', '.join(f'{e:.2f}' for e in eps)}) at update {update} of {updates} of a rollout (optimizer step "
            f"{step}); {bound} bounds A < 0 tokens there (what to do: report.md, docs/RESULTS.md \"The drift map\").")
