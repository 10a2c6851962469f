"""The study's grids: the committed comparison (methods x updates per rollout x seeds, ACPO's alpha sweep), the
test suite's quick grid, and the drift grid (the testbed's learning rate as the off-policy drift axis)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..losses import POLICY_LOSSES
from ..training.drift_guard import KL_THRESHOLD, MIN_TOKENS
from .cell import DEFAULT_LR, variant_label
from .recipe import RecipeRunSpec
from .results import clip_free
from .stats import difference_interval
from .table import match_verdict
from .testbed import RunSpec, WarmupSpec

PAPER_METHODS = ("acpo", "ppo_clip", "dapo", "cispo", "high_entropy", "low_entropy", "ar_lopti")
UPRS = (2, 8, 16)
ALPHAS = (0.5, 1.0)  # plus the default 3.0, which is the main grid's ACPO


def build_grid(
    tasks=("add1", "add2"),
    methods=None,
    uprs=UPRS,
    seeds=range(8),
    alphas=ALPHAS,
    base: RunSpec | None = None,
    warmups: dict[str, WarmupSpec] | None = None,
) -> list[RunSpec]:
    """methods x uprs x seeds per task, plus ACPO at each alpha of ``alphas`` x uprs x seeds (the alpha sweep:
    with ACPO's default 3.0 from the main grid it is {0.5, 1, 3}). ``methods`` defaults to every registered
    policy loss. Ordered seed-major, so a partial grid has whole seeds."""
    base = base or RunSpec()
    methods = tuple(methods) if methods else tuple(sorted(POLICY_LOSSES))
    specs = []
    for seed in seeds:
        for task in tasks:
            warm = (warmups or {}).get(task, replace(base.warmup, task=task))
            for upr in uprs:
                for method in methods:
                    specs.append(replace(base, task=task, method=method, upr=upr, seed=seed, alpha=None, warmup=warm))
                for alpha in alphas:
                    specs.append(replace(base, task=task, method="acpo", upr=upr, seed=seed, alpha=alpha, warmup=warm))
    return specs


def quick_grid(out_steps: int = 4) -> list[RunSpec]:
    """The test suite's grid: 2 methods x 2 regimes x 1 seed on add1 plus one alpha, a 40-step warm-up, a few RL
    steps with small rollouts."""
    warm = WarmupSpec(task="add1", steps=30, hidden_size=32, batch_size=32, warmup_steps=5)
    base = RunSpec(steps=out_steps, batch_size=16, num_generations=4, max_new_tokens=12, eval_every=2, eval_k=2,
                   last_evals=2, grad_every=2, lr=5e-4, warmup=warm)
    return build_grid(tasks=("add1",), methods=("acpo", "dapo"), uprs=(1, 2), seeds=(0,), alphas=(1.0,), base=base,
                      warmups={"add1": warm})


@dataclass(frozen=True)
class DriftLevel:
    """A drift level: the learning rate, and enough steps for every level to learn (on the real model: rollouts)."""

    name: str
    lr: float
    steps: int


# Off-policy drift is set by the learning rate (with Adam the policy moves ~lr per optimizer update). "matched": the
# bin-0 ratio std at the last update of a 16-update rollout within 2x of SmolLM2-135M's at the paper's lr 1e-6
# (calibrated on 3 rollouts: 0.19-0.21 at lr 1e-5, the edge of that band, so half of it); "between": the geometric
# middle; "extreme": the committed grid. Steps grow as lr falls, by less than 1/lr: a low lr learns far more per
# unit of lr x steps (rollout reward +0.08 in 135 steps at 1e-5 against +0.2 in 200 at 5e-4); docs/RESULTS.md.
DRIFT_LEVELS = (
    DriftLevel("extreme", DEFAULT_LR, 200),
    DriftLevel("between", 5e-5, 400),
    DriftLevel("matched", 5e-6, 1600),
)
# (method, alpha, clip): the drift map's variants, those the issue keeps when the grid must shrink: ACPO (the
# paper's), ACPO with the authors' public defaults, acpo_log, DAPO and CISPO. ACPO alpha 0.5 and the fixed clip were
# dropped (with them `acpo-study plan --drift` printed 9.3 h; both are in the committed grid at the extreme level).
# The extreme level's cells have the committed grid's settings and run ids, but run in their own root (study/drift/)
# with the testbed's kernels pinned (testbed.CPU_KERNELS).
DRIFT_VARIANTS = (
    ("acpo", None, None),
    ("acpo", 1.0, (0.05, 0.5)),
    ("acpo_log", None, None),
    ("dapo", None, None),
    ("cispo", None, None),
)


def drift_grid(
    tasks=("add2",),
    levels=DRIFT_LEVELS,
    variants=DRIFT_VARIANTS,
    uprs=(2, 16),
    seeds=range(8),
) -> list[RunSpec]:
    """variants x uprs x seeds at each drift level, ordered seed-major so that a partial grid is whole blocks (a
    level and a seed: every variant and regime). A level's runs evaluate 5 times and diagnose the gradient 20 times
    whatever their length (the committed grid's 40 / 10 at 200 steps), so a long run costs no more per step than a
    short one."""
    specs = []
    for seed in seeds:
        for level in levels:
            base = RunSpec(lr=level.lr, steps=level.steps, eval_every=level.steps // 5, grad_every=level.steps // 20)
            for task in tasks:
                for upr in uprs:
                    for method, alpha, clip in variants:
                        specs.append(replace(base, task=task, method=method, upr=upr, seed=seed, alpha=alpha,
                                             clip=clip, warmup=replace(base.warmup, task=task)))
    return specs


REAL_MODEL_RECIPE = "configs/study/smollm2_addition.yaml"
REAL_MODEL_ROLLOUT = 64  # completions per rollout in every regime: 8 prompts x 8
# (name, learning rate, rollouts per run); calibrated by pilots (docs/RESULTS.md, "On a real model"). "a": the demo's
# lr, where ACPO alpha 3's eps pass 1; "b": an lr where their mean over rollouts stays below 1 in every bin at every
# update of a 16-update rollout (2e-6 passes 1, 5e-6 far), with the 16 rollouts its pilot took to gain 21 points.
REAL_MODEL_LEVELS = (
    DriftLevel("a", 2e-5, 8),
    DriftLevel("b", 1e-6, 16),
)
# The issue's four variants: ACPO (the paper's alpha 3), ACPO with the authors' public defaults, DAPO, CISPO.
REAL_MODEL_VARIANTS = (
    ("acpo", None, None),
    ("acpo", 1.0, (0.05, 0.5)),
    ("dapo", None, None),
    ("cispo", None, None),
)


# Wall seconds of the real-model grid's parts with two runs side by side (2 cores, one thread each): a rollout with
# its updates, per regime; one evaluation of the held-out set (100 problems x 4 samples); a run's start and end
# (imports, model load, plots). Fitted to level a's seed-1 runs (upr 2: 284-314 s; upr 16: 556-580 s, collapsed runs
# whose completions run to the length limit) with nothing else running.
REAL_MODEL_SECONDS = {"rollout": {2: 26.0, 16: 58.0}, "eval": 35.0, "start": 25.0}


def estimate_recipe_seconds(specs: list[RecipeRunSpec], seconds: dict, jobs: int = 2) -> float:
    """Wall time of recipe cells that sample ``rollouts`` rollouts, ``jobs`` at a time, from ``seconds`` (a grid's
    measured parts, e.g. ``REAL_MODEL_SECONDS``): each cell's start, rollouts and evaluations (one every
    ``eval_steps``, the last one after training), plus one before-training evaluation per seed (its cells share it)."""
    total = sum(seconds["start"] + s.rollouts * seconds["rollout"][s.upr] + s.num_steps // s.eval_steps * seconds["eval"]
                for s in specs)
    return (total + len({s.seed for s in specs}) * seconds["eval"]) / jobs


def real_model_grid(levels=REAL_MODEL_LEVELS, variants=REAL_MODEL_VARIANTS, uprs=(2, 16), seeds=range(8),
                    recipe: str = REAL_MODEL_RECIPE) -> list[RecipeRunSpec]:
    """variants x uprs x seeds at each drift level on the real model, level-major (a level is finished before the
    next starts) and seed-major within a level. A variant is (method, alpha, clip) or (method, alpha, clip,
    options). Every cell samples ``rollouts`` rollouts of ``REAL_MODEL_ROLLOUT`` completions; the held-out set is
    evaluated before (shared by a seed's cells), halfway and after; the ratio diagnostics are logged at every update
    (no gradient diagnostics: 2K + 2 extra backward passes)."""
    specs = []
    for level in levels:
        for seed in seeds:
            for upr in uprs:
                for method, alpha, clip, *options in variants:
                    specs.append(RecipeRunSpec(recipe, method=method, upr=upr, seed=seed, alpha=alpha, clip=clip,
                                               lr=level.lr, rollout=REAL_MODEL_ROLLOUT, rollouts=level.steps,
                                               eval_steps=level.steps * upr // 2, grad_every=0,
                                               options=options[0] if options else ()))
    return specs


# Why ACPO wins at level b (docs/RESULTS.md, "Why ACPO wins"): one variant per hypothesis, each fixed from the
# committed level-b diagnostics of ACPO alpha 3 at 16 updates per rollout before any of its runs (study/smollm2/
# table.md, "Diagnostics": mean eps over seeds and updates k >= 1, bins 0..4 = 0.43 / 0.28 / 0.27 / 0.27 / 0.23).
ACPO_MEAN_RANGES = (0.43, 0.28, 0.27, 0.27, 0.23)
ABLATION_VARIANTS = (
    # H1, a wider clip: TRL's fixed symmetric clip as wide as ACPO's widest mean range, for every token
    ("ppo_clip", None, None, (("epsilon", max(ACPO_MEAN_RANGES)),)),
    # H2, bin-wise widths: each bin's range frozen at ACPO's mean (no adaptation)
    ("bin_clip", None, None, (("bin_clip_ranges", ACPO_MEAN_RANGES),)),
    # H3 without bins: ACPO's adaptation over one bin (its clipping still reported in 5 bins)
    ("acpo", None, None, (("acpo_num_bins", 1), ("diagnostics_num_bins", 5))),
)
ABLATION_HYPOTHESES = ("H1, a wider clip", "H2, bin-wise widths", "H3 without bins")  # one per ABLATION_VARIANTS
ABLATION_REFERENCES = (("acpo", None, None), ("dapo", None, None))  # extended to the ablation's seeds at upr 16
# At 2 updates per rollout H1 cannot differ from the committed runs but by rounding: there ACPO alpha 1 (the same
# run as alpha 3) never clipped a token, and its largest range of any update, bin and seed was 0.281 < 0.43, so H1's
# clip never binds either and its loss is the unclipped one, as ACPO's was. H2 (bin 1: 0.28 < 0.281) and H3 (one
# range, not bounded by the committed runs) can bind there, so they run.
ABLATION_NEAR_VARIANTS = ABLATION_VARIANTS[1:]


def ablation_hypotheses() -> dict[str, str]:
    """{variant label (a table row): hypothesis} of the ablation's variants, for the report's verdicts."""
    return {variant_label(method, alpha, clip, options): name
            for (method, alpha, clip, options), name in zip(ABLATION_VARIANTS, ABLATION_HYPOTHESES)}


def ablation_grid(seeds_off_policy=range(16), seeds_near=range(8)) -> list[RecipeRunSpec]:
    """The ablation at level b: the three variants and the references (ACPO alpha 3, DAPO) at 16 updates per rollout
    over ``seeds_off_policy``, then H2 and H3 at 2 updates per rollout over ``seeds_near`` (the references' runs
    there are the committed grid's; H1's would be the same run: ``ABLATION_NEAR_VARIANTS``). The committed cells of
    the real-model grid are the same run ids, so ``acpo-study run --ablation`` skips them."""
    level = next(level for level in REAL_MODEL_LEVELS if level.name == "b")
    return (real_model_grid(levels=[level], variants=ABLATION_VARIANTS + ABLATION_REFERENCES, uprs=(16,),
                            seeds=seeds_off_policy)
            + real_model_grid(levels=[level], variants=ABLATION_NEAR_VARIANTS, uprs=(2,), seeds=seeds_near))


def estimate_seconds(specs: list[RunSpec], seconds_per_step: dict[int, float], jobs: int = 2) -> float:
    """Wall time of ``specs`` at ``seconds_per_step[upr]`` (measured per optimizer step, one thread), ``jobs`` at a time."""
    total = sum(s.steps * seconds_per_step.get(s.upr, max(seconds_per_step.values())) for s in specs)
    return total / jobs if math.isfinite(total) else total


# A second task on the same model (docs/RESULTS.md, "A second task"): single-digit multiplication, chosen by pilots
# (seed 0): two-digit sums start at 0.25% avg@4; products start at 12.0% and gain 14 points in 16 rollouts at 2
# updates per rollout at lr 1e-6, where ACPO alpha 3's eps at 16 updates per rollout (mini-batches of 4, as in the
# grid) average at most 0.75 per (update, bin) over 4 rollouts (single updates up to 1.24): the low-drift level b.
SECOND_TASK_RECIPE = "configs/study/smollm2_multiplication.yaml"
SECOND_TASK_LEVEL = DriftLevel("b", 1e-6, 16)
SECOND_TASK_VARIANTS = REAL_MODEL_VARIANTS  # and the ablation's variants that match ACPO alpha 3 (ablation_matches)


def ablation_matches(results: list[dict]) -> tuple:
    """The entries of ``ABLATION_VARIANTS`` that match ACPO alpha 3 at 16 updates per rollout in ``results`` (the
    finished runs; ``table.match_verdict``: the paired interval to ACPO alpha 3 holds 0, the one to DAPO lies above
    0). They join the second task with their part-1 settings."""
    group = ablation_grid(seeds_off_policy=range(1), seeds_near=())[0].group
    finals: dict = {}
    for r in results:
        if r.get("group") == group and r["spec"]["upr"] == 16:  # (results of the recipe grids name their group)
            finals.setdefault(r["variant"], {})[r["spec"]["seed"]] = r["final_sampled"]
    reference, baseline = finals.get("acpo", {}), finals.get("dapo", {})
    labels = ablation_hypotheses()
    return tuple(variant for variant, label in zip(ABLATION_VARIANTS, labels) if label in finals
                 and match_verdict(difference_interval(finals[label], reference),
                                   difference_interval(finals[label], baseline)) == "matches ACPO alpha 3")


# At 2 updates per rollout the clip acts on one update per rollout, and at level b of the addition it bound on none:
# the four variants' runs were the same in every seed. So the second task runs ACPO alpha 3's cells at 2 updates
# first; a seed's other cells there are dropped when that run logged no token with a nonzero advantage and a ratio
# outside [0.8, 1.2] (``results.clip_free``): every variant's clip contains [0.8, 1.2] (ACPO's ranges are 0.2 + alpha std, DAPO's
# [0.8, 1.3], CISPO's mask [0.8, 1.3] and cap 1.45, the dual clip 3), so each would have made the same updates on
# the same samples, step after step. The same up to rounding: a loss path that rounds otherwise can move a weight's
# last bit, which the addition's runs showed changes no sampled completion.
NEAR_REFERENCE = ("acpo", None, None)


def is_near_reference(spec: RecipeRunSpec) -> bool:
    """Whether ``spec`` is a reference run of the second task (``NEAR_REFERENCE`` at 2 updates per rollout)."""
    return spec.upr == 2 and (spec.method, spec.alpha, spec.clip, spec.options) == (*NEAR_REFERENCE, ())


def second_task_grid(variants=None, uprs=(2, 16), seeds=range(8),
                     results: list[dict] | None = None) -> list[RecipeRunSpec]:
    """The second task's cells: the real-model grid's design (rollouts of 64 completions, 16 rollouts, the held-out
    set before, halfway and after) on the multiplication recipe at level b for ``variants`` (default:
    ``SECOND_TASK_VARIANTS`` and the ablation's matches in ``results``, the finished runs): ACPO alpha 3's cells at
    2 updates per rollout first, then the rest seed-major, less the cells at 2 updates that ``results`` show to be
    the reference's run again (``NEAR_REFERENCE``)."""
    if variants is None:
        variants = SECOND_TASK_VARIANTS + ablation_matches(results or [])
    specs = real_model_grid(levels=[SECOND_TASK_LEVEL], variants=variants, uprs=uprs, seeds=seeds,
                            recipe=SECOND_TASK_RECIPE)
    is_reference = [is_near_reference(s) for s in specs]
    by_id = {r["run_id"]: r for r in results or ()}
    same = {s.seed for s, ref in zip(specs, is_reference)
            if ref and s.run_id in by_id and clip_free(by_id[s.run_id])}
    return ([s for s, ref in zip(specs, is_reference) if ref]
            + [s for s, ref in zip(specs, is_reference) if not ref and not (s.upr == 2 and s.seed in same)])


# The drift guard on the real model (docs/RESULTS.md, "A drift guard"): the real-model grid's recipe, ACPO alpha 3
# and DAPO at 16 updates per rollout, paired by seed with the committed unguarded cells. A skipped update still
# counts as a step, so a guarded cell samples its unguarded pair's rollouts (prompts and number of completions).
# The first guarded runs (committed, 2026-12-03) decided on the bin-0 ratio std at 0.3 whatever its token count;
# these decide by the token rule (acpo_trl/training/drift_guard.py), fixed before their runs: ratio_std at 0.3 on at least
# 16 bin-0 tokens, else k3 over all tokens at KL_THRESHOLD; and the "kl" arm, k3 at KL_THRESHOLD on 16 tokens.
MIN_TOKENS_OPTION = (("drift_guard_min_tokens", MIN_TOKENS),)
GUARD_OPTIONS = (("drift_guard", "ratio_std"), ("drift_guard_threshold", 0.3), *MIN_TOKENS_OPTION)
KL_GUARD_OPTIONS = (("drift_guard", "kl"), ("drift_guard_threshold", KL_THRESHOLD), *MIN_TOKENS_OPTION)
GUARD_METHODS = ("acpo", "dapo")


def guard_grid(levels=("b", "a"), seeds=range(8), measures=("ratio_std", "kl")) -> list[RecipeRunSpec]:
    """The guarded cells, seed-major within a level: the ratio_std guard at level b (lr 1e-6), then at level a (lr
    2e-5), then the kl guard at level a (the issue's order: the kl arm only if the budget allows)."""
    by_name = {level.name: level for level in REAL_MODEL_LEVELS}
    arms = [(name, GUARD_OPTIONS) for name in levels if "ratio_std" in measures]
    arms += [("a", KL_GUARD_OPTIONS)] if "kl" in measures and "a" in levels else []
    return [spec for name, options in arms
            for spec in real_model_grid(levels=[by_name[name]], uprs=(16,), seeds=seeds,
                                        variants=[(method, None, None, options) for method in GUARD_METHODS])]


# A task with long, worked completions (docs/RESULTS.md, "A task with long, worked completions"; issue 44): running
# sums of 6 numbers written step by step (~65 tokens, ~29% of them in bins 0-3: ~18 per completion against the
# addition's ~1.2), from one supervised warm-up (the recipe's header). Level b by the drift measurement committed in
# study/running_sum/drift/ (`acpo-study drift --config LONG_TASK_RECIPE --lrs 1e-6 --upr 16 --rollouts 4 --rollout
# 64`): at lr 1e-6 ACPO alpha 3's mean range stays below 1 at every (update, bin) (largest 0.94, bin 0). 8 rollouts of
# 64 completions per run (the addition's grids took 16): sized to the issue's ~30 h with the measured cost of a
# rollout here (LONG_TASK_SECONDS); the gain pilot at 2 updates per rollout gained 3.75 points by rollout 8 and 10.25
# by rollout 16 (20.5% -> 30.75% avg@4).
LONG_TASK_RECIPE = "configs/study/smollm2_running_sum.yaml"
LONG_TASK_LEVEL = DriftLevel("b", 1e-6, 8)
# Fixed from that committed drift measurement before any grid run (tests/test_study.py recomputes them from it):
# ACPO alpha 3's range per bin, averaged over the updates k >= 1 of a 16-update rollout (each a mean over its 4
# rollouts), and their mean weighted by each (update, bin)'s token share.
LONG_TASK_BIN_RANGES = (0.54, 0.48, 0.42, 0.34, 0.22)
LONG_TASK_MEAN_RANGE = 0.28
# The gradient-dominance measure (diagnostics.gradients) on the last transformer block of SmolLM2-135M (its 30th),
# which bounds its 2 + 2 x 5 extra backward passes to that block and the output layer.
LONG_TASK_GRAD_OPTIONS = (("diagnostics_grad_params", (r"layers\.29\.",)),)
LONG_TASK_VARIANTS = (  # in the order of priority
    ("acpo", None, None),
    ("dapo", None, None),
    ("ppo_clip", None, None, (("epsilon", LONG_TASK_MEAN_RANGE),)),  # the wide fixed clip, as wide on average
    ("dcpo", None, None),  # DCPO's bounds in the old probability, the authors' defaults (losses/dcpo.py)
    ("bin_clip", None, None, (("bin_clip_ranges", LONG_TASK_BIN_RANGES),)),  # ACPO's ranges frozen per bin
)
LONG_TASK_SEEDS = {"acpo": 8, "dapo": 8, "ppo_clip": 8, "dcpo": 8, "bin_clip": 6}
# Wall seconds with another run beside it (2 cores, one thread each) at lr 1e-6: a rollout with its updates and
# gradient diagnostics (upr 2: the grid's seed-0 run, 3,157 s of steps / 8 rollouts, its one gradient measurement per
# rollout over 32 completions ~150 s of it; upr 16: the seed-0 run's 2,462 s less its evaluation and start, / 8
# rollouts, two measurements over 4 completions each); one evaluation of the 100 held-out problems x 4 (the gain
# pilot's two in training: 904 s); a run's start and end.
LONG_TASK_SECONDS = {"rollout": {2: 395.0, 16: 240.0}, "eval": 452.0, "start": 100.0}


def long_task_cell(variant: tuple, upr: int, seed: int) -> RecipeRunSpec:
    """One cell of the long task: ``variant`` (method, alpha, clip[, options]) at ``upr`` updates per rollout, 8
    rollouts of 64 completions, the held-out set before and after, a checkpoint every 2 rollouts (a run a session's end
    cuts short resumes from it), the gradient diagnostics twice per rollout at 16 updates (at rotating update indices,
    half of them in the rollout's second half) and once per rollout at 2."""
    method, alpha, clip, *options = variant
    level = LONG_TASK_LEVEL
    return RecipeRunSpec(LONG_TASK_RECIPE, method=method, upr=upr, seed=seed, alpha=alpha, clip=clip, lr=level.lr,
                         rollout=REAL_MODEL_ROLLOUT, rollouts=level.steps, eval_steps=level.steps * upr,
                         grad_every=max(2, upr // 2), save_every=2 * upr,
                         options=(*(options[0] if options else ()), *LONG_TASK_GRAD_OPTIONS))


def long_task_grid(results: list[dict] | None = None, seeds: int | None = None) -> list[RecipeRunSpec]:
    """The long task's cells in the issue's order of priority, each tier seed-major: ACPO alpha 3 at 2 updates per
    rollout with ACPO alpha 3, DAPO and the wide fixed clip at 16 (8 seeds); DCPO at 16 (8 seeds); the frozen bin-wise
    clip at 16 (6 seeds); then DAPO at 2 updates per rollout for the seeds whose ACPO run there moved a token with a
    nonzero advantage outside [0.8, 1.2] (the second task's rule: ``results``, the finished runs, decide; a seed whose
    reference run has not finished has no such cell yet). ``seeds``: at most that many per variant."""
    def seeds_of(method):
        return range(min(LONG_TASK_SEEDS[method], seeds or LONG_TASK_SEEDS[method]))

    acpo, dapo, wide, dcpo, frozen = LONG_TASK_VARIANTS
    specs = [long_task_cell(variant, upr, seed) for seed in seeds_of("acpo")
             for variant, upr in ((acpo, 2), (acpo, 16), (dapo, 16), (wide, 16))]
    specs += [long_task_cell(dcpo, 16, seed) for seed in seeds_of("dcpo")]
    specs += [long_task_cell(frozen, 16, seed) for seed in seeds_of("bin_clip")]
    by_id = {r["run_id"]: r for r in results or ()}
    references = {seed: by_id.get(long_task_cell(acpo, 2, seed).run_id) for seed in seeds_of("dapo")}
    specs += [long_task_cell(dapo, 2, seed) for seed, result in references.items()
              if result is not None and clip_free(result) is not True]
    return specs


# Against what a TRL user would otherwise pick, and against no clip (docs/RESULTS.md, "Against what a TRL user would
# otherwise pick"; issue 60). Every setting fixed before the runs, from TRL's documentation or the authors' run
# scripts: GSPO at TRL's paper-index settings (`gspo`: ppo_clip at sequence level, epsilon 3e-4 / 4e-4, no dual clip),
# SAPO at TRL's temperatures (1.0 / 1.05, the defaults), TRL's CISPO at its documented cap (epsilon_high 5.0, the
# trl_cispo default), DCPO as its authors' run_dcpo.sh runs it (clip_ratio_low 0.2, clip_ratio_high 0.28, clip_ratio_c
# 10), and the unclipped update; ACPO alpha 3 and the study's DAPO (0.2 / 0.3) as in the committed grids.
ALTERNATIVES_LONG_VARIANTS = (  # the order of priority: the unclipped update and the references first
    ("unclipped", None, None),
    ("acpo", None, None),
    ("dapo", None, None),
    ("gspo", None, None),
    ("sapo", None, None),
    ("dcpo", None, None, (("epsilon", 0.2), ("epsilon_high", 0.28), ("dual_clip_c", 10.0))),
)
ALTERNATIVES_LEVEL_A_VARIANTS = (("unclipped", None, None), ("gspo", None, None), ("sapo", None, None),
                                 ("trl_cispo", None, None))
# The long task's evaluation: 500 held-out problems x 4 (the first 100 are the committed cells'), with the coupled
# sampler (docs/evaluation.md), in batches of ALTERNATIVES_EVAL_BATCH problems (the coupled sampler's samples do not
# depend on it). Measuring options: they name no variant.
ALTERNATIVES_EVAL = (("num_eval_tasks", 500), ("eval_sampler", "coupled"), ("eval_batch_size", 16))
# Wall seconds of a long-task cell with this evaluation, another run beside it: the committed cells' rollout at 16
# updates (LONG_TASK_SECONDS) and one evaluation of 500 problems x 4, ~75 s per 16 problems with the warm-up's
# checkpoint (acpo-eval --recipe configs/study/smollm2_running_sum.yaml --limit 64 --sampler coupled --batch_size 16,
# one thread beside another job, 2026-12-07).
ALTERNATIVES_SECONDS = {"rollout": LONG_TASK_SECONDS["rollout"], "eval": 2350.0, "start": LONG_TASK_SECONDS["start"]}
# The cells whose final models are kept for the measurement of the coupled evaluation's gain (pairs ACPO alpha 3 -
# unclipped and ACPO alpha 3 - DAPO).
KEPT_MODELS = ("unclipped", "acpo", "dapo")


def alternatives_grid(part: str = "long", seeds=range(8)) -> list[RecipeRunSpec]:
    """The cells of issue 60, seed-major within a tier. ``part="long"``: the long task at lr 1e-6, 16 updates per rollout,
    8 rollouts of 64 (``long_task_cell``'s design), evaluated on 500 problems with the coupled sampler, in tiers: the
    unclipped update, ACPO alpha 3 and DAPO (their models kept), then GSPO, SAPO and the authors' DCPO. ``part="a"``:
    the addition at level a (lr 2e-5, the real-model grid's design at 16 updates per rollout) for the unclipped
    update, GSPO, SAPO and TRL's CISPO, evaluated as the committed level-a cells they are paired with."""
    if part == "a":
        level = next(level for level in REAL_MODEL_LEVELS if level.name == "a")
        return real_model_grid(levels=[level], variants=ALTERNATIVES_LEVEL_A_VARIANTS, uprs=(16,), seeds=seeds)
    if part != "long":
        raise ValueError(f"alternatives_grid: part={part!r}; 'long' or 'a'.")

    def cell(variant, seed):
        method, alpha, clip, *options = variant
        base = long_task_cell((method, alpha, clip, (*(options[0] if options else ()), *ALTERNATIVES_EVAL)), 16, seed)
        return replace(base, keep_model=method in KEPT_MODELS)

    first, rest = ALTERNATIVES_LONG_VARIANTS[:3], ALTERNATIVES_LONG_VARIANTS[3:]
    return ([cell(v, seed) for seed in seeds for v in first] + [cell(v, seed) for seed in seeds for v in rest])


def measured_seconds(spec) -> tuple[dict, str] | None:
    """(the measured wall seconds of a recipe cell's parts, what one line of `plan` is per) for the grids whose parts
    were measured, None for another recipe (its time depends on the model and the hardware)."""
    if not isinstance(spec, RecipeRunSpec) or not spec.rollout:
        return None
    if spec.recipe == LONG_TASK_RECIPE:
        return (ALTERNATIVES_SECONDS if ALTERNATIVES_EVAL[0] in spec.options else LONG_TASK_SECONDS), "method"
    if spec.recipe in (REAL_MODEL_RECIPE, SECOND_TASK_RECIPE):
        return REAL_MODEL_SECONDS, "group"
    return None
