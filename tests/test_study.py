"""The study: testbed problems, reward and teacher; the table (drops, ranks, collapses); the quick grid through
the real command (worker processes), its resumption, and an interrupted run redone alone."""

from __future__ import annotations

import json
import math
import os
import random
import sys
from pathlib import Path

import pytest


def test_testbed_split_reward_and_teacher():
    from acpo_trl.data.testbed import task_problems
    from acpo_trl.rewards.testbed import addition_reward
    from acpo_trl.study.testbed import noisy_teacher

    train, held = task_problems("add1")
    assert len(train) == 70 and len(held) == 30 and sum(p.carry for p in held) == 14
    assert not set(train) & set(held)
    train2, held2 = task_problems("add2")
    assert len(train2) == 400 and len(held2) == 60 and all(p.answer >= 20 for p in held2)
    good, two = "The answer is \\boxed{12}.", "\\boxed{12} or \\boxed{12}"
    assert addition_reward(None, [good, two, "12", [{"role": "assistant", "content": good}]], ["12"] * 4) == [1, 0, 0, 1]
    rng = random.Random(0)
    carry = [p for p in train if p.carry][0]
    answers = [noisy_teacher(carry, rng) for _ in range(4000)]
    assert abs(answers.count(carry.answer) / 4000 - 0.25) < 0.03
    assert abs(answers.count(carry.answer - 10) / 4000 - 0.60) < 0.03


def _result(task, variant, upr, seed, acc, collapsed=False):
    method = variant.split("(")[0]
    return {"spec": {"task": task, "upr": upr, "seed": seed, "method": method}, "variant": variant,
            "run_id": f"{task}/{variant}/upr{upr}/seed{seed}", "final_sampled": acc, "last_evals_mean": acc,
            "start_sampled": 0.37, "collapsed": collapsed, "mean_angle_deg": 10.0}


def test_table_means_drops_ranks_and_collapses():
    from acpo_trl.study.stats import summarize
    from acpo_trl.study.table import write_table

    results = [_result("add1", "acpo", 2, s, 0.8) for s in range(2)] + [_result("add1", "acpo", 8, s, 0.6) for s in range(2)]
    results += [_result("add1", "dapo", 2, 0, 0.7), _result("add1", "dapo", 2, 1, 0.5),
                _result("add1", "dapo", 8, 0, 0.7), _result("add1", "dapo", 8, 1, 0.0, collapsed=True)]
    rows = summarize(results)["add1"]["rows"]
    assert rows["acpo"]["regimes"][2]["final"] == pytest.approx((0.8, 0.0))
    assert rows["dapo"]["regimes"][2]["final"][1] == pytest.approx(0.1414, abs=1e-3)  # sample sd
    assert rows["acpo"]["drop"][8] == pytest.approx(0.25)
    assert rows["acpo"]["avg_rank"] == 1.0 and rows["dapo"]["avg_rank"] == 2.0
    tied = summarize(results + [_result("add1", "unclipped", u, s, 0.8 if u == 2 else 0.6) for u in (2, 8)
                                for s in range(2)])["add1"]["rows"]
    assert [tied[v]["ranks"] for v in ("acpo", "unclipped", "dapo")] == [[1.5, 1.5], [1.5, 1.5], [3.0, 3.0]]
    assert rows["dapo"]["regimes"][8]["collapsed"] == 1
    assert rows["dapo"]["regimes"][8]["below_start"] == 0  # the collapsed run is counted as collapsed only
    assert summarize(results, exclude_collapsed=True)["add1"]["rows"]["dapo"]["regimes"][8]["final"][0] == 0.7
    text = write_table(results)
    assert "1/2" in text and "Without the collapsed runs" in text and "+25.0%" in text
    assert "| add1 | not recorded | 0, 1 | 8 | 0.370 |" in text  # runs made before warm-ups were recorded
    assert "on each warm-up alone" not in text  # one warm-up: no split
    for r in results:
        if r["spec"]["seed"] == 0:
            r["warmup_digest"] = "0123456789ab"
    text = write_table(results)
    assert "| add1 | 0123456789ab | 0 | 4 | 0.370 |" in text
    # each warm-up's own comparison: acpo 0.8 -> 0.6 on both; dapo 0.7 -> 0.7 on one, 0.5 -> 0.0 on the other
    assert "| add1 | `acpo` | 0123456789ab: +25.0% (1) · not recorded: +25.0% (1) |" in text
    assert "| add1 | `dapo` | 0123456789ab: +0.0% (1) · not recorded: +100.0% (1) |" in text
    # a variant run at one regime only (or not at both on a warm-up) has no drop there: a dash, never nan
    text = write_table([*results, _result("add1", "cispo", 8, 0, 0.5)])
    assert "| add1 | `cispo` | – |" in text and "nan" not in text
    recipe_run = _result("long", "acpo", 16, 0, 0.3)
    recipe_run["spec"]["recipe"] = "configs/study/long.yaml"  # a recipe's run starts from the recipe's model
    assert "| long | `model_name_or_path` of configs/study/long.yaml | 0 | 1 | 0.370 |" in write_table([recipe_run])


def test_a_table_shows_a_dash_for_no_number():
    from acpo_trl.study.stats import shown

    assert shown(12.345, "+.1f", "%") == "+12.3%" and shown(0.5, ".2f") == "0.50"
    assert shown(math.nan, "+.1f", "%") == "–" and shown(math.inf, ".2f") == "–"


def test_variants_paired_by_seed():
    from acpo_trl.study.stats import difference_interval, summarize
    from acpo_trl.study.table import variant_pairs_table

    # acpo beats dapo by 5 points on every seed while the seeds' own levels spread by 30: pairing by seed gives a
    # tight interval around +5 (unpaired resampling would span about +-15)
    acpo, dapo = {0: 0.55, 1: 0.35, 2: 0.65, 3: 0.45}, {0: 0.50, 1: 0.30, 2: 0.60, 3: 0.40}
    assert difference_interval(acpo, dapo) == pytest.approx((0.05, 0.05))
    lo, hi = difference_interval(acpo, {**dapo, 1: 0.40})
    assert lo < 0.0 < 0.025 < hi  # one seed where dapo leads (0.35 vs 0.40) widens it to hold 0 and the mean
    assert all(x != x for x in difference_interval({0: 0.5}, {0: 0.4, 1: 0.3}))  # one common seed: nan
    results = [_result("add1", "acpo", upr, s, acc + (upr == 16) * 0.1) for s, acc in acpo.items() for upr in (2, 16)]
    results += [_result("add1", "dapo", upr, s, acc) for s, acc in dapo.items() for upr in (2, 16)]
    text = "\n".join(variant_pairs_table(summarize(results)))
    assert "| add1 | 2 | `acpo` - `dapo` | +5.0 [+5.0, +5.0] | [+5.0, +5.0] | 4 | 5.0, 5.0, 5.0, 5.0 |" in text
    assert "| add1 | 16 | `acpo` - `dapo` | +15.0 [+15.0, +15.0] | [+15.0, +15.0] | 4 | 15.0, 15.0, 15.0, 15.0 |" in text
    assert "| add1 | 16 - 2 | `acpo` | +10.0 [+10.0, +10.0] | [+10.0, +10.0] | 4 | 10.0, 10.0, 10.0, 10.0 |" in text
    assert "| add1 | 16 - 2 | `dapo` | +0.0 [+0.0, +0.0] | [+0.0, +0.0] | 4 |" in text
    assert "Comparisons per task (rows above): add1: 4." in text
    results = [r for r in results if not (r["variant"] == "dapo" and r["spec"]["seed"] == 1)]
    results += [_result("add1", "dapo", upr, 1, 0.40) for upr in (2, 16)]
    text = "\n".join(variant_pairs_table(summarize(results)))
    assert "| `acpo` - `dapo` | +2.5 [" in text and "| 4 | 5.0, -5.0, 5.0, 5.0 |" in text  # in seed order
    # the paired t interval: mean 2.5, sd 5 over 4 seeds, t(3) = 3.182: 2.5 +- 3.182 x 5 / 2 = [-5.5, +10.5], wider
    # than the bootstrap's [-2.5, +5.0], whose draws are means of the same four differences
    assert "| `acpo` - `dapo` | +2.5 [-2.5, +5.0] | [-5.5, +10.5] | 4 |" in text


def test_guard_table_pairs_guarded_runs_with_the_unguarded_ones():
    """A guarded run is compared seed by seed with the same method's unguarded runs at its regime and at the
    fewest updates per rollout; the table counts the rollouts it cut, the updates it applied and its wall time."""
    from acpo_trl.study.results import summarize_guard
    from acpo_trl.study.table import guard_table

    entries = []  # 2 rollouts of 4 updates: the first cut at its third update, the second not
    for step, (reward, taken, cut, applied, std) in enumerate(
            [(0.2, 1, 0, 1, 0.0), (None, 2, 0, 2, 0.1), (None, 2, 1, 2, 0.4), (None, 2, 1, 2, None),
             (0.3, 1, 1, 3, 0.0), (None, 2, 1, 4, 0.2), (None, 3, 1, 5, 0.1), (None, 4, 1, 6, 0.2)], 1):
        entries.append({"step": step, "drift_guard/updates_in_rollout": taken, "drift_guard/rollouts_cut": cut,
                        "drift_guard/updates_applied": applied, "drift_guard/ratio_std": std,
                        "drift_guard/kl": None if std is None else std / 10, **({"reward": reward} if reward else {})})
    summary = summarize_guard(entries)
    assert summary["updates_per_rollout"] == [2, 4] and (summary["updates_applied"], summary["rollouts_cut"]) == (6, 1)
    assert summary["measures"][2] == [3, 0.4, 0.04, None, None, None] and len(summary["measures"]) == 7
    assert summarize_guard([{"step": 1, "reward": 0.1}]) is None

    options = [["drift_guard", "ratio_std"], ["drift_guard_threshold", 0.3]]
    results = []
    for seed, (plain2, plain16, guarded) in enumerate([(0.3, 0.1, 0.35), (0.4, 0.2, 0.45)]):
        for upr, acc in ((2, plain2), (16, plain16)):
            results.append({**_result("add1", "dapo", upr, seed, acc, collapsed=acc < 0.15), "seconds": 100.0})
        run = _result("add1", "dapo(drift_guard=ratio_std, drift_guard_threshold=0.3)", 16, seed, guarded)
        run["spec"].update(options=options, steps=8)
        results.append({**run, "seconds": 60.0, "drift_guard": summary})
    text = "\n".join(guard_table(results))
    assert ("| add1 | `dapo` | 16 | ratio_std > 0.3 | 2 | 0.400 | +25.0 [+25.0, +25.0] | upr 2: +5.0 [+5.0, +5.0] | "
            "0/2 / 1/2 | 2/4 | 12/16 | 3.0 | 4/14 | – | 4.0 | 60 / 100 |") in text  # a ratio std of 0: one token
    assert guard_table([r for r in results if not r.get("drift_guard")]) == []
    # a run with the token rule logs the tokens of each decision and how it was taken (0 own, 1 k3 fallback)
    for entry, (bin0, tokens, way) in zip(entries, [(0, 30, 1), (1, 30, 1), (20, 40, 0), (0, 0, 2), (3, 30, 1),
                                                    (17, 30, 0), (2, 30, 1), (16, 30, 0)]):
        entry.update({"drift_guard/bin0_tokens": bin0, "drift_guard/tokens": tokens, "drift_guard/decided_by": way})
    summary = summarize_guard(entries)
    assert summary["measures"][2] == [3, 0.4, 0.04, 20, 40, 0] and summary["measures"][3] == [4, None, None, 0, 0, 2]
    for run in results:
        if run.get("drift_guard"):
            run["spec"]["options"] = options + [["drift_guard_min_tokens", 16]]
            run["drift_guard"] = summary
    text = "\n".join(guard_table(results))
    assert "| ratio_std > 0.3 on >= 16 tokens | 2 |" in text and "| 6/16 | 6 / 8 / 2 | 4.0 |" in text
    assert "Guard rules against each other" not in text  # one rule per method and regime: nothing to pair
    for seed, acc in enumerate([0.30, 0.40]):  # a second rule on the same method and regime, 5 points below
        run = _result("add1", "dapo(drift_guard=kl)", 16, seed, acc)
        run["spec"].update(options=[["drift_guard", "kl"], ["drift_guard_threshold", 0.07],
                                    ["drift_guard_min_tokens", 16]], steps=8)
        results.append({**run, "seconds": 60.0, "drift_guard": summary})
    text = "\n".join(guard_table(results))
    assert ("| add1 | `dapo` | 16 | kl > 0.07 on >= 16 tokens | ratio_std > 0.3 on >= 16 tokens | -5.0 [-5.0, -5.0] "
            "| 2 |") in text


def test_drop_interval_and_the_across_tasks_summary():
    from acpo_trl.study.stats import drop_interval, summarize
    from acpo_trl.study.table import write_table

    def seeds(*values):
        return dict(enumerate(values))

    lo, hi = drop_interval(seeds(0.8, 0.82, 0.78, 0.8), seeds(0.4, 0.6, 0.5, 0.5))
    assert 0.25 < lo < 0.375 < hi < 0.5  # the point estimate 0.375 lies inside
    assert drop_interval(seeds(0.8, 0.8), seeds(0.8, 0.8)) == (0.0, 0.0)
    assert all(x != x for x in drop_interval(seeds(0.8), seeds(0.5, 0.6)))  # one common seed: no interval (nan)
    # paired by seed: each seed's upr-16 run is 0.1 below its upr-2 run, whatever the seed's own level, so the
    # interval is tight; resampling the regimes independently would mix the seeds' levels into it
    near, far = seeds(0.8, 0.6, 0.7, 0.5), seeds(0.7, 0.5, 0.6, 0.4)
    lo, hi = drop_interval(near, far)
    assert 0.12 < lo < 0.1 / 0.65 < hi < 0.21  # independent resampling would span about [-0.2, +0.4]
    assert drop_interval(near, {**far, 7: 0.0}) == (lo, hi)  # a seed one regime lacks is left out
    results = [_result(task, v, upr, s, acc) for task in ("add1", "add2") for s in range(3)
               for v, upr, acc in (("acpo", 2, 0.8), ("acpo", 16, 0.4), ("dapo", 2, 0.7), ("dapo", 16, 0.7))]
    summary = summarize(results)
    assert summary["add1"]["rows"]["acpo"]["drop_ci"][16] == pytest.approx((0.5, 0.5))
    text = write_table(results)
    assert "### All tasks" in text and "+50.0% [+50, +50]" in text
    overall = text[text.index("### All tasks"):]
    assert "| `acpo` | 4 | 1.50 | +50.0% | +50.0% | +50.0% |" in overall
    assert "| `dapo` | 4 | 1.50 | +0.0% | +0.0% | +0.0% |" in overall


def test_ablation_verdicts_follow_the_rule_fixed_before_the_runs():
    """A variant matches ACPO alpha 3 when its paired interval to ACPO alpha 3 holds 0 and the one to DAPO lies
    above 0; the report names each ablation variant's hypothesis and places it against both references."""
    from acpo_trl.study.grids import ABLATION_HYPOTHESES, ablation_hypotheses
    from acpo_trl.study.table import match_verdict, write_table

    assert match_verdict((-0.02, 0.01), (0.01, 0.08)) == "matches ACPO alpha 3"
    assert match_verdict((-0.02, 0.01), (-0.01, 0.08)) == "not told apart from ACPO alpha 3, not told apart from DAPO"
    assert match_verdict((-0.09, -0.01), (-0.03, 0.02)) == "below ACPO alpha 3, not told apart from DAPO"
    assert match_verdict((-0.09, -0.01), (0.01, 0.02)) == "below ACPO alpha 3, above DAPO"
    assert match_verdict((0.01, 0.05), (0.03, 0.09)) == "above ACPO alpha 3, above DAPO"
    assert match_verdict((float("nan"),) * 2, (0.0, 0.1)) == "too few seeds"

    hypotheses = ablation_hypotheses()
    assert list(hypotheses.values()) == list(ABLATION_HYPOTHESES)
    wide, frozen, one_bin = hypotheses
    assert wide == "ppo_clip(epsilon=0.43)" and one_bin == "acpo(acpo_num_bins=1)"  # diagnostics_* fields name nothing
    assert frozen == "bin_clip(bin_clip_ranges=0.43/0.28/0.27/0.27/0.23)"
    # per seed: ACPO alpha 3 at 0.5 + s/100, DAPO 5 points below it, the wide clip 5 below ACPO give or take 1, the
    # one-bin ACPO ACPO's give or take 1
    results = []
    for s in range(8):
        wobble = 0.01 if s % 2 else -0.01
        for variant, acc in (("acpo", 0.5), ("dapo", 0.45), (wide, 0.45 + wobble), (one_bin, 0.5 + wobble)):
            results.append(_result("g", variant, 16, s, acc + s / 100))
            if variant == wide:  # the method's own clip fractions per (update k, bin); k = 0 (r = 1) is left out
                results[-1]["diagnostics"] = {"bins": {"clip_frac_neg": {"0,0": 0.9, "1,0": 0.1, "2,0": 0.3,
                                                                         "1,1": 0.02},
                                                       "clip_frac_pos": {"1,4": 0.005}},
                                              "grad_k": {}, "grad": {}}
    text = write_table(results, hypotheses=hypotheses)
    table = text[text.index("## The ablation"):]
    assert (f"| g | 16 | H1, a wider clip | `{wide}` | -5.0 [-5.8, -4.3] (8) | +0.0 [-0.8, +0.8] (8) | "
            "below ACPO alpha 3, not told apart from DAPO | 20.0 / 2.0 / – / – / – | – / – / – / – / 0.50 |") in table
    assert (f"| g | 16 | H3 without bins | `{one_bin}` | +0.0 [-0.8, +0.8] (8) | +5.0 [+4.3, +5.8] (8) | "
            "matches ACPO alpha 3 | – | – |") in table
    assert "| g | 16 | reference | `acpo` | – | – | – | – | – |" in table and "reference | `dapo`" in table
    assert "H2" not in table  # a variant that did not run has no row
    assert "## The ablation" not in write_table([r for r in results if r["variant"] in ("acpo", "dapo")],
                                                hypotheses=hypotheses)


def test_collapse_rule():
    from acpo_trl.study.results import collapsed

    assert collapsed([(s, 0.5 if s < 100 else 0.0) for s in range(1, 201, 8)], 200)
    assert not collapsed([(s, 0.0 if s < 190 else 0.1) for s in range(1, 201, 8)], 200)
    assert not collapsed([(200, 0.0)], 200)  # one rollout is not "stayed"
    # 8 rollouts of 16 updates: the last 20% holds one rollout, so the last two decide
    assert collapsed([(1 + 16 * i, r) for i, r in enumerate([0.2, 0.1, 0.2, 0.1, 0.02, 0.0, 0.0, 0.0])], 128)
    assert not collapsed([(1 + 16 * i, r) for i, r in enumerate([0.2, 0.1, 0.2, 0.1, 0.02, 0.0, 0.1, 0.0])], 128)


@pytest.mark.slow
def test_quick_grid_runs_resumes_and_redoes_only_an_interrupted_run(tmp_path, capsys):
    from acpo_trl.study.cli import main
    from acpo_trl.study.grids import quick_grid
    from acpo_trl.study.runner import check_reproduces, run_grid
    from acpo_trl.study.testbed import cpu_kernels

    out = tmp_path / "study"
    assert main(["run", "--quick", "--out", str(out), "--plots", "some"]) == 0
    specs = quick_grid()
    results = {s.run_id: json.loads((out / "runs" / s.run_id / "result.json").read_text()) for s in specs}
    assert {r["variant"] for r in results.values()} == {"acpo", "dapo", "acpo(alpha=1)"}
    for r in results.values():
        assert [e["step"] for e in r["evals"]] == [0, 2, 4] and 0 <= r["final_sampled"] <= 1
    # The workers pin ATen's kernels to AVX2 whatever the machine's best (a run is chaotic: AVX-512 kernels give
    # another run), and a warm-up's folder names its kernels, so one made with other kernels is never reused.
    assert {r["cpu_kernels"] for r in results.values()} == {"AVX2"}
    warmups = lambda: {p.name.rsplit("-", 1)[1] for p in (out / "warmups").iterdir() if p.is_dir()}  # noqa: E731
    assert warmups() == {"avx2"}
    metrics = (out / "runs" / "add1/acpo/upr2/seed0/metrics.jsonl").read_text()
    assert "diag/k1/bin" in metrics and "grad/norm_used" in metrics  # second update of a rollout is logged as k = 1
    table = (out / "table.md").read_text()
    assert "`acpo(alpha=1)`" in table and "final acc, upr 2" in table
    assert (out / "plots" / "add1_learning_curves.png").exists()
    assert list((out / "plots").glob("add1_acpo_upr2_seed0_bins.png"))

    capsys.readouterr()
    assert main(["run", "--quick", "--out", str(out), "--no-report"]) == 0  # nothing left to do
    assert "0 to run" in capsys.readouterr().out

    # Resuming first checks that this machine reproduces a finished run bit for bit (rerun in a worker); where it
    # does not from the same warm-up (every run records the digest of the one it started from), the kernels differ
    # after the warm-up and the grid refuses to resume.
    check = check_reproduces(specs, out, out / "warmups", log=lambda m: None)
    assert check.reproduced and check.warmup_digest == check.stored_digest
    assert {r["warmup_digest"] for r in results.values()} == {check.warmup_digest}
    stored = {s.run_id: (out / "runs" / s.run_id / "result.json").read_text() for s in specs}
    for run_id, text in stored.items():
        tampered = json.loads(text)
        tampered["rewards"][0][1] += 0.5
        (out / "runs" / run_id / "result.json").write_text(json.dumps(tampered))
    (out / "runs" / specs[0].run_id / "result.json").unlink()
    with pytest.raises(SystemExit) as err:
        main(["run", "--quick", "--out", str(out), "--no-report"])
    assert err.value.code == 2 and "does not reproduce here: held-out" in capsys.readouterr().err
    for run_id, text in stored.items():
        (out / "runs" / run_id / "result.json").write_text(text)

    # An interrupted grid: one run lost its result (killed mid-run); only that one is redone.
    lost = specs[0]
    (out / "runs" / lost.run_id / "result.json").unlink()
    stamps = {s.run_id: (out / "runs" / s.run_id / "result.json").stat().st_mtime_ns for s in specs[1:]}
    assert run_grid(specs, out, out / "warmups", jobs=0, log=lambda m: None) == []
    redone = json.loads((out / "runs" / lost.run_id / "result.json").read_text())
    assert redone["cpu_kernels"] == cpu_kernels() and warmups() == {"avx2", cpu_kernels().lower()}
    assert stamps == {s.run_id: (out / "runs" / s.run_id / "result.json").stat().st_mtime_ns for s in specs[1:]}

    # A fresh clone has the result.json files but no metrics.jsonl (git does not keep them): the report still runs,
    # says which runs' plots it cannot redraw, and leaves their committed plots alone.
    (out / "runs" / "add1/acpo/upr2/seed0/metrics.jsonl").unlink()
    plot = out / "plots" / "add1_acpo_upr2_seed0_bins.png"
    plot.write_bytes(b"committed")
    capsys.readouterr()
    assert main(["report", "--out", str(out)]) == 0
    assert "no metrics.jsonl" in capsys.readouterr().out and plot.read_bytes() == b"committed"


# ---------------------------------------------------------------------------------------------------------------
# The study through a recipe: each cell an acpo-train run; the GPU recipe, built but not run here.

def toy_recipe(tmp_path, tiny_dir, **overrides) -> Path:
    """A recipe of the tiny local model on the toy task (CPU, a few steps), written to ``tmp_path/toy_recipe.yaml``."""
    import yaml

    recipe = tmp_path / "toy_recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": tiny_dir, "task": "toy", "num_train_tasks": 64, "num_eval_tasks": 4, "eval_k": 2,
        "use_cpu": True, "bf16": False, "per_device_train_batch_size": 8, "num_generations": 4,
        "max_completion_length": 8, "learning_rate": 0.01, "max_steps": 2, "report_to": "none",
        "disable_tqdm": True, "output_dir": str(tmp_path / "unused"), **overrides,
    }))
    return recipe


STUDY_RECIPE = "configs/study/qwen2.5-0.5b-instruct_countdown.yaml"


def test_recipe_cell_changes_only_what_the_study_varies(tmp_path):
    import yaml

    from acpo_trl.study.recipe import RecipeRunSpec, recipe_grid
    from acpo_trl.study.runner import spec_from_json

    config = yaml.safe_load(open(STUDY_RECIPE))
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**config, "gradient_accumulation_steps": 2}))
    spec = RecipeRunSpec(str(path), method="acpo", upr=8, seed=3, alpha=0.5, launcher=("acpo-train",))
    command = spec.command(tmp_path / "cell")
    args = dict(zip(command[1::2], command[2::2]))
    assert command[0] == "acpo-train" and args["--config"] == str(path)
    assert args["--steps_per_generation"] == "16"  # 8 updates per rollout x 2 accumulation steps
    assert args["--policy_loss"] == "acpo" and args["--acpo_alpha"] == "0.5" and args["--seed"] == "3"
    assert args["--report"] == "true" and args["--diagnostics"] == "true" and "--max_steps" not in args
    assert spec.run_id == "r/acpo-alpha0.5/upr8/seed3" and spec.variant == "acpo(alpha=0.5)"
    assert spec_from_json(json.loads(json.dumps(spec.to_json()))) == spec  # through the worker queue
    assert spec.to_json()["steps"] == config["max_steps"] and spec.to_json()["task"] == "r"

    grid = recipe_grid(STUDY_RECIPE, methods=["acpo", "dapo"], uprs=[2, 16], seeds=range(2), alphas=[1.0])
    assert len(grid) == 12 and grid[0].seed == 0 and grid[-1].seed == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\n")
    with pytest.raises(ValueError, match="model_name_or_path"):
        RecipeRunSpec(str(bad))
    # the GPU recipe parses with acpo-train's own parser, with every override the study adds
    from acpo_trl.recipe import make_parser

    grid_cell = recipe_grid(STUDY_RECIPE, methods=["cispo"], uprs=[16], seeds=[1], alphas=[])[0]
    script_args, training_args, _ = make_parser().parse_args_and_config(
        args=[*grid_cell.command(tmp_path / "gpu")[len(grid_cell.launcher):], "--use_cpu", "true"])
    assert training_args.policy_loss == "masked_cispo" and training_args.updates_per_rollout == 16  # the new name
    assert script_args.report and script_args.report_eval_steps == 50 and training_args.diagnostics
    assert not script_args.save_final_model  # a cell writes no weights
    from acpo_trl.recipe import ACPOScriptArguments

    with pytest.raises(ValueError, match="report_eval_steps.*report: true"):
        ACPOScriptArguments(task="toy", report_eval_steps=5)


def test_real_model_grid_samples_the_same_rollouts_in_every_regime(tmp_path, capsys):
    """The real-model grid: level a whole before level b, seed by seed; every cell samples rollouts of 64
    completions for its level's number of rollouts, the mini-batch (and so the number of updates) being what the
    regime changes; the before-training evaluation is shared per seed; `plan` prints the time per level."""
    from acpo_trl.study.cli import main
    from acpo_trl.study.grids import REAL_MODEL_LEVELS, real_model_grid
    from acpo_trl.recipe import make_parser

    specs = real_model_grid(seeds=range(2))
    assert len(specs) == 2 * 2 * 2 * 4 and len({s.run_id for s in specs}) == len(specs)
    assert [s.lr for s in specs] == [REAL_MODEL_LEVELS[0].lr] * 16 + [REAL_MODEL_LEVELS[1].lr] * 16
    assert {s.variant for s in specs} == {"acpo", "acpo(alpha=1, clip=[0.05, 0.5])", "dapo", "cispo"}
    completions = set()
    for spec in (s for s in specs if s.seed == 1 and s.lr == REAL_MODEL_LEVELS[0].lr):
        command = spec.command(tmp_path / "cell", spec.before_file(tmp_path))
        script_args, args, _ = make_parser().parse_args_and_config(args=command[len(spec.launcher):])
        assert args.updates_per_rollout == spec.upr and args.learning_rate == REAL_MODEL_LEVELS[0].lr
        assert args.max_steps == REAL_MODEL_LEVELS[0].steps * spec.upr and args.diagnostics
        completions.add(args.per_device_train_batch_size * args.steps_per_generation)
        assert script_args.report_before_file == str(tmp_path / "before" / "smollm2_addition" / "seed1.json")
        assert args.share_prompt_prefix and not script_args.save_final_model
    assert completions == {64}
    assert specs[0].run_id == "smollm2_addition@lr2e-05/acpo/upr2/seed0"
    assert main(["plan", "--real-model", "--levels", "a", "--seeds", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "smollm2_addition@lr2e-05, upr 16: 4 runs" in out and "8 runs (8 to do); estimated" in out
    with pytest.raises(ValueError, match="rollout=64: must split into 3 updates"):
        type(specs[0])(specs[0].recipe, upr=3, rollout=64, rollouts=2)


def test_second_task_grid_is_the_real_model_design_on_multiplication(tmp_path):
    from acpo_trl.study.grids import second_task_grid
    from acpo_trl.recipe import make_parser

    specs = second_task_grid(seeds=range(2))
    assert len(specs) == 2 * 2 * 4 and {s.group for s in specs} == {"smollm2_multiplication@lr1e-06"}
    script_args, args, _ = make_parser().parse_args_and_config(args=specs[-1].command(tmp_path / "cell")[3:])
    assert (script_args.task, args.learning_rate, args.max_steps, args.updates_per_rollout) == (
        "multiplication", 1e-6, 16 * 16, 16)
    assert args.per_device_train_batch_size * args.steps_per_generation == 64


def test_second_task_drops_the_cells_at_2_updates_that_would_repeat_the_reference_run():
    """ACPO alpha 3's runs at 2 updates per rollout come first; a seed's other cells there are dropped only when that
    run logged no token with an advantage outside [0.8, 1.2] at any update (then no variant's clip would bind), kept
    when one did or when the run did not log it."""
    from acpo_trl.study.grids import is_near_reference, second_task_grid
    from acpo_trl.study.results import clip_free

    specs = second_task_grid(seeds=range(3))
    assert [s.seed for s in specs[:3]] == [0, 1, 2] and all(is_near_reference(s) for s in specs[:3])
    assert sum(map(is_near_reference, specs)) == 3  # the authors' defaults (alpha 1) are not the reference

    def result(spec, moved):
        bins_max = {} if moved is None else {"moved_frac": {"0,0": 0.0, "1,0": moved, "1,4": 0.0}}
        return {"run_id": spec.run_id, "diagnostics": {"bins_max": bins_max}}

    results = [result(s, moved) for s, moved in zip(specs[:3], (0.0, 0.004, None))]
    assert [clip_free(r) for r in results] == [True, False, None]
    kept = second_task_grid(seeds=range(3), results=results)
    dropped = {s.run_id for s in specs} - {s.run_id for s in kept}
    assert {(s.seed, s.upr) for s in specs if s.run_id in dropped} == {(0, 2)} and len(dropped) == 3


def test_second_task_run_starts_with_the_reference_runs_and_then_skips_what_they_settled(tmp_path, monkeypatch,
                                                                                         capsys):
    """``acpo-study run --second-task``: refused until the ablation is finished; then the reference runs first, then
    the grid rebuilt from their results, with the ablation's variants that matched ACPO alpha 3."""
    import json

    from acpo_trl.study import cli
    from acpo_trl.study.grids import ablation_grid

    calls = []

    def fake_run_grid(specs, out, cache, jobs, log):
        calls.append([s.run_id for s in specs])
        for spec in specs:
            if not (out / "runs" / spec.run_id / "result.json").exists():
                (out / "runs" / spec.run_id).mkdir(parents=True)
                moved = {"1,0": 0.0 if spec.seed == 0 else 0.01}
                (out / "runs" / spec.run_id / "result.json").write_text(json.dumps(
                    {"run_id": spec.run_id, "diagnostics": {"bins_max": {"moved_frac": moved}}}))
        return []

    monkeypatch.setattr(cli, "run_grid", fake_run_grid)
    with pytest.raises(SystemExit):  # part 1 first: its verdicts decide which of its variants join
        cli.main(["run", "--second-task", "--seeds", "2", "--out", str(tmp_path), "--no-report"])
    assert "the ablation has 96 of its 96 runs left" in capsys.readouterr().err and not calls
    # the finished ablation: the 1-bin ACPO matches ACPO alpha 3 (5 points above DAPO, within a point of ACPO)
    finals = {"acpo": 0.5, "dapo": 0.45, "acpo(acpo_num_bins=1)": 0.5, "ppo_clip(epsilon=0.43)": 0.45}
    for spec in ablation_grid():
        run = tmp_path / "runs" / spec.run_id
        run.mkdir(parents=True)
        final = finals.get(spec.variant, 0.4) + (0.01 if spec.seed % 2 else -0.01) * (spec.variant != "acpo")
        (run / "result.json").write_text(json.dumps({
            "run_id": spec.run_id, "group": spec.group, "variant": spec.variant, "final_sampled": final,
            "spec": {"upr": spec.upr, "seed": spec.seed}}))
    assert cli.main(["run", "--second-task", "--seeds", "2", "--out", str(tmp_path), "--no-report"]) == 0
    first, rest = calls
    assert first == ["smollm2_multiplication@lr1e-06/acpo/upr2/seed0", "smollm2_multiplication@lr1e-06/acpo/upr2/seed1"]
    assert len(rest) == 2 * 2 * 5 - 4 and not any("upr2/seed0" in run_id for run_id in rest[2:])
    assert {run_id.split("/")[1] for run_id in rest} == {"acpo", "acpo-alpha1-clip0.05-0.5", "dapo", "cispo",
                                                          "acpo-acpo_num_bins1"}


def test_ablation_grid_names_its_variants_and_reuses_the_committed_cells(tmp_path):
    """The ablation's variants, fixed from ACPO's committed mean ranges: each names its options in its row and
    folder, passes them to acpo-train (H3 diagnosed in 5 bins, which does not name it), and round-trips through the
    worker queue; the references keep the committed run ids, so their committed runs are skipped."""
    import json

    from acpo_trl.study.grids import ACPO_MEAN_RANGES, ablation_grid
    from acpo_trl.study.runner import spec_from_json
    from acpo_trl.recipe import make_parser

    specs = ablation_grid()
    assert len(specs) == 3 * 16 + 2 * 16 + 2 * 8 and len({s.run_id for s in specs}) == len(specs)
    assert {s.variant for s in specs} == {
        "ppo_clip(epsilon=0.43)", "bin_clip(bin_clip_ranges=0.43/0.28/0.27/0.27/0.23)", "acpo(acpo_num_bins=1)",
        "acpo", "dapo"}
    by_variant = {s.variant: s for s in specs if s.seed == 9 and s.upr == 16}
    assert by_variant["acpo"].run_id == "smollm2_addition@lr1e-06/acpo/upr16/seed9"
    assert by_variant["acpo(acpo_num_bins=1)"].run_id == "smollm2_addition@lr1e-06/acpo-acpo_num_bins1/upr16/seed9"
    parsed = {}
    for variant, spec in by_variant.items():
        assert spec_from_json(json.loads(json.dumps(spec.to_json()))) == spec
        command = spec.command(tmp_path / "cell")
        assert command[:3] == ["python", "-m", "acpo_trl.train"]  # recorded without this machine's path
        parsed[variant] = make_parser().parse_args_and_config(args=command[3:])[1]
    assert parsed["ppo_clip(epsilon=0.43)"].epsilon == 0.43 and parsed["ppo_clip(epsilon=0.43)"].policy_loss == "ppo_clip"
    frozen = parsed["bin_clip(bin_clip_ranges=0.43/0.28/0.27/0.27/0.23)"]
    assert tuple(frozen.bin_clip_ranges) == ACPO_MEAN_RANGES
    one_bin = parsed["acpo(acpo_num_bins=1)"]
    assert (one_bin.acpo_num_bins, one_bin.diagnostics_num_bins) == (1, 5)
    assert all(s.seed < 8 for s in specs if s.upr == 2) and {s.method for s in specs if s.upr == 2} == {
        "bin_clip", "acpo"}


def test_a_recipe_cell_keys_its_start_evaluation_by_the_checkpoint_it_starts_from(tmp_path):
    """A warm-up trained again on a CPU that rounds differently is another start: its own before-training
    evaluation and its own digest, never an earlier checkpoint's; a Hub name keeps the plain path."""
    import yaml

    from acpo_trl.study.recipe import RecipeRunSpec, checkpoint_digest

    def cell(model: str) -> RecipeRunSpec:
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump({**yaml.safe_load(open(STUDY_RECIPE)), "model_name_or_path": model}))
        return RecipeRunSpec(str(path), seed=2)

    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "model.safetensors").write_bytes(b"weights of the first machine")
    first = cell(str(warm)).before_file("out")
    (warm / "model.safetensors").write_bytes(b"weights of the second machine")
    second = cell(str(warm)).before_file("out")
    assert first.parent.parent == second.parent.parent == Path("out/before/r") and first.name == "seed2.json"
    assert first != second and second.parent.name == checkpoint_digest(str(warm))
    assert checkpoint_digest("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    assert cell("HuggingFaceTB/SmolLM2-135M-Instruct").before_file("out") == Path("out/before/r/seed2.json")


@pytest.mark.slow
def test_recipe_study_runs_acpo_train_per_cell_and_reports(tmp_path, tiny_dir, capsys):

    from acpo_trl.study.cli import main
    from acpo_trl.study.recipe import checkpoint_digest

    recipe = toy_recipe(tmp_path, tiny_dir)
    out = tmp_path / "study"
    digest = checkpoint_digest(tiny_dir)
    argv = ["run", "--recipe", str(recipe), "--out", str(out), "--methods", "acpo", "dapo", "--uprs", "1", "2",
            "--seeds", "1", "--alphas", "--eval-steps", "1", "--jobs", "2", "--plots", "some"]
    assert main(argv) == 0
    for method in ("acpo", "dapo"):
        for upr in (1, 2):
            cell = out / "runs" / f"toy_recipe/{method}/upr{upr}/seed0"
            result = json.loads((cell / "result.json").read_text())
            assert [e["step"] for e in result["evals"]] == [0, 1, 2]
            assert {"sampled", "pass", "truncation"} <= set(result["evals"][-1])
            assert result["warmup_digest"] == digest  # the start: a local checkpoint
            before = json.loads((out / "before" / "toy_recipe" / digest / "seed0.json").read_text())  # shared
            assert result["evals"][0]["sampled"] == before["eval/toy/avg@2"]
            assert not (cell / "model.safetensors").exists()
            assert f"--policy_loss {method}" in result["command"]
            assert f"--steps_per_generation {upr}" in result["command"]
            assert result["spec"]["task"] == "toy_recipe" and result["diagnostics"]["bins"]["acpo_eps"]
            # per problem, the correct samples of 2 (a paired comparison problem by problem)
            assert len(result["correct"]["before"]) == len(result["correct"]["after"]) == 4
            assert sum(result["correct"]["after"]) / 8 == result["evals"][-1]["sampled"]
    table = (out / "table.md").read_text()
    assert "### toy_recipe" in table and "`dapo`" in table and "final acc, upr 2" in table
    assert (out / "plots" / "toy_recipe_learning_curves.png").exists()
    capsys.readouterr()
    assert main([*argv, "--no-report"]) == 0  # resumable: every cell is finished
    assert "0 to run" in capsys.readouterr().out


@pytest.mark.slow
def test_trls_trust_regions_and_the_unclipped_control_run_as_study_cells_with_the_diagnostics(tmp_path, tiny_dir):
    """GSPO (the study's name: ppo_clip at sequence level, TRL's 3e-4 / 4e-4), SAPO, TRL's CISPO, VESPO and the
    unclipped update, each an acpo-train cell of a recipe study with the per-bin diagnostics and its clip or gate
    shares; the study's DAPO keeps the committed grids' 0.3."""

    from acpo_trl.study.cli import main

    recipe = toy_recipe(tmp_path, tiny_dir, learning_rate=0.05)
    out = tmp_path / "study"
    methods = ("gspo", "sapo", "trl_cispo", "vespo", "unclipped", "dapo")
    assert main(["run", "--recipe", str(recipe), "--out", str(out), "--methods", *methods, "--uprs", "2",
                 "--seeds", "1", "--alphas", "--eval-steps", "2", "--jobs", "2", "--plots", "none"]) == 0
    own = {"gspo": "clip_ratio/region_mean", "sapo": "sapo/gate_mean", "trl_cispo": "cispo/weight_clip_frac",
           "vespo": "vespo/phi_mean", "unclipped": "clip_ratio/region_mean", "dapo": "clip_ratio/region_mean"}
    for method in methods:
        cell = out / "runs" / f"toy_recipe/{method}/upr2/seed0"
        result = json.loads((cell / "result.json").read_text())
        assert result["diagnostics"]["bins"]["ratio_std"], method  # the per-bin ratio spread, any method
        entries = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines() if line.strip()]
        assert any(own[method] in e for e in entries), method
        assert any("diag/k1/bin0/clip_frac_pos" in e or "diag/k1/bin1/clip_frac_pos" in e for e in entries), method
    command = lambda m: json.loads((out / "runs" / f"toy_recipe/{m}/upr2/seed0/result.json").read_text())["command"]  # noqa: E731
    assert "--policy_loss ppo_clip" in command("gspo") and "--importance_sampling_level sequence" in command("gspo")
    assert "--epsilon 0.0003 --epsilon_high 0.0004 --dual_clip_c None" in command("gspo")
    assert "--policy_loss dapo" in command("dapo") and "--epsilon_high 0.3" in command("dapo")


@pytest.mark.slow
def test_drift_command_measures_ratio_dispersion_per_update_and_bin(tmp_path, tiny_dir, capsys):
    """``acpo-study drift`` on a recipe (the tiny model here): per learning rate, per k and bin, JSON + table + PNG;
    the first update of a rollout is on-policy (ratio std ~0, eps = base) and a larger lr drifts more."""

    from acpo_trl.study.cli import main

    recipe = toy_recipe(tmp_path, tiny_dir)
    out = tmp_path / "drift"
    assert main(["drift", "--config", str(recipe), "--lrs", "1e-4", "3e-2", "--upr", "3", "--rollouts", "1",
                 "--out", str(out)]) == 0
    data = json.loads((out / "drift.json").read_text())
    assert sorted(data["runs"]) == ["0.0001", "0.03"] and data["settings"]["updates_per_rollout"] == 3
    for run in data["runs"].values():
        bins = run["bins"]
        assert run["steps"] == 3 and run["policy_loss"] == "acpo"
        assert all(bins["ratio_std"][f"0,{b}"] < 1e-4 for b in range(5) if f"0,{b}" in bins["ratio_std"])
        assert all(bins["acpo_eps"][f"0,{b}"] == pytest.approx(0.2, abs=1e-3) for b in range(5)
                   if f"0,{b}" in bins["acpo_eps"])
    slow, fast = (max(data["runs"][lr]["bins"]["logratio_std"][f"2,{b}"] for b in range(5)
                      if f"2,{b}" in data["runs"][lr]["bins"]["logratio_std"]) for lr in ("0.0001", "0.03"))
    assert fast > 10 * slow > 0
    table = (out / "drift.md").read_text()
    assert "| 0.03 | 2 |" in table and "| 0.0001 | 1 |" in table
    assert (out / "drift.png").stat().st_size > 1000
    assert [p.name for p in (out / "lr0.03").iterdir()] == ["metrics.jsonl"]  # the trained weights are not kept
    capsys.readouterr()
    assert main(["drift", "--config", str(recipe), "--lrs", "3e-2", "--upr", "3", "--rollouts", "1",
                 "--out", str(out)]) == 0  # resumable: a measured lr is not rerun
    assert "already measured" in capsys.readouterr().out


def test_drift_in_a_grids_regime_splits_each_rollout_into_upr_mini_batches(tmp_path):
    """``acpo-study drift --rollout 64 --upr 16``: mini-batches of 4, as the grids' cells at 16 updates per rollout."""
    from acpo_trl.study.drift import drift_argv

    recipe = "configs/study/smollm2_running_sum.yaml"
    argv = drift_argv(recipe, 1e-6, 16, 2, 0, tmp_path, rollout=64)
    assert "--per_device_train_batch_size=4" in argv and "--max_steps=32" in argv
    with pytest.raises(ValueError, match="--rollout 60: must split into --upr 16 mini-batches"):
        drift_argv(recipe, 1e-6, 16, 2, 0, tmp_path, rollout=60)
    assert "--per_device_train_batch_size=4" not in drift_argv(recipe, 1e-6, 16, 2, 0, tmp_path)


def test_drift_map_places_each_variant_at_its_levels_measured_drift(tmp_path):
    """Per variant and level: the level's measured drift (median over its variants of the bin-0 ratio std at the last
    update of the upr-16 runs) and the variant's own, the final accuracies, the drop with its interval; the real
    model's measured drift marked on the figure; each level's drift measures."""
    from acpo_trl.study.drift import drift_map, level_drift_table

    def result(variant, lr, upr, seed, acc, drift):
        group = "add2" if lr == 5e-4 else f"add2@lr{lr:g}"
        return {"spec": {"task": "add2", "upr": upr, "seed": seed, "lr": lr, "method": variant}, "variant": variant,
                "group": group, "run_id": f"{group}/{variant}/upr{upr}/seed{seed}", "final_sampled": acc,
                "last_evals_mean": acc, "start_sampled": 0.4, "collapsed": False, "mean_angle_deg": None,
                "diagnostics": {"bins": {"ratio_std": {f"{upr - 1},0": drift}}}}

    results = []
    for seed in range(3):
        for lr, drift, far in ((5e-4, 0.6, 0.3), (5e-6, 0.1, 0.6)):
            results += [result("acpo", lr, 2, seed, 0.6, 0.01), result("acpo", lr, 16, seed, far + 0.01 * seed, drift)]
            results += [result("dapo", lr, 2, seed, 0.6, 0.01), result("dapo", lr, 16, seed, 0.6, drift / 2)]
        results += [result("ppo_clip", 5e-4, 2, seed, 0.6, 0.01), result("ppo_clip", 5e-4, 16, seed, 0.6, 0.5)]
    reference = {"settings": {"updates_per_rollout": 16}, "runs": {"1e-06": {
        "lr": 1e-6, "model": "smollm2", "bins": {"ratio_std": {"15,0": 0.095}}}}}
    lines = drift_map(results, "add2", reference, tmp_path / "map.png")
    rows = {(cols[0], cols[1]): cols for cols in (line.strip("| ").split(" | ") for line in lines[2:])}
    assert rows[("`acpo`", "0.0005")][2:4] == ["0.500", "0.600"]  # median of acpo 0.6, dapo 0.3, ppo_clip 0.5
    assert rows[("`acpo`", "5e-06")][2:4] == ["0.075", "0.100"]
    assert rows[("`acpo`", "0.0005")][6].startswith("+48.3% [")  # (0.6 - 0.31) / 0.6
    assert rows[("`dapo`", "5e-06")][6].startswith("+0.0%") and rows[("`dapo`", "5e-06")][2:4] == ["0.075", "0.050"]
    assert not any(variant == "`ppo_clip`" for variant, _ in rows)  # one level only: no curve to draw
    assert (tmp_path / "map.png").stat().st_size > 1000
    # a real model at one level, with the testbed's map behind it: its one point per variant is kept
    real = [{**result("acpo", 2e-5, upr, seed, acc, 0.4 if upr == 16 else 0.01), "group": "real@lr2e-05"}
            for seed in range(3) for upr, acc in ((2, 0.8), (16, 0.4))]
    for r in real:
        r["spec"]["task"] = "real"
    lines = drift_map(real, "real", None, tmp_path / "real.png", beside=("testbed add2", results, "add2"))
    assert len(lines) == 3 and lines[2].startswith("| `acpo` | 2e-05 | 0.400 |") and "+50.0%" in lines[2]
    assert (tmp_path / "real.png").stat().st_size > 1000
    # each level's drift measures: ACPO's eps where the runs tracked their largest value, "not logged" where not
    for seed, r in enumerate(r for r in real if r["spec"]["upr"] == 16):
        r["diagnostics"]["bins"]["acpo_eps"] = {"15,0": 0.7, "3,2": 0.9 - 0.1 * seed}
        r["diagnostics"]["bins_max"] = {"acpo_eps": {"15,0": 0.8 + 0.3 * seed}}
    assert level_drift_table(real, "real")[2] == "| 2e-05 | 0.400 (0.400-0.400) | 1.40 | 0.90 | 2 of 3 | 0-1 of 1 |"
    assert level_drift_table(results, "add2")[2] == ("| 0.0005 | 0.500 (0.300-0.600) | not logged | – | not logged "
                                                     "| not logged |")
    # a recipe's task at one learning rate (the second task): its level's drift table in drift_map.md, no map
    from acpo_trl.study.cli import _drift_maps

    (tmp_path / "plots").mkdir()
    _drift_maps(real, tmp_path, tmp_path / "plots")
    written = (tmp_path / "drift_map.md").read_text()
    assert "### real\n" in written and "| 2e-05 | 0.400 (0.400-0.400) | 1.40 |" in written
    assert not (tmp_path / "plots" / "real_drift_map.png").exists()
    # variants with options (the ablation's, the guard's) move no level's drift and draw no point
    extra = [result("ppo_clip", 5e-4, upr, seed, 0.6, 0.02) for upr in (2, 16) for seed in range(3)]
    for r in extra:
        r["spec"]["options"] = [["epsilon", 0.43]]
        r["variant"] = "ppo_clip(epsilon=0.43)"
    assert level_drift_table(results + extra, "add2") == level_drift_table(results, "add2")
    assert drift_map(results + extra, "add2", None, tmp_path / "g.png") == drift_map(results, "add2", None,
                                                                                     tmp_path / "g.png")


def test_drift_grid_extends_the_committed_grid_in_whole_blocks(capsys):
    """The extreme level's cells of the committed grid's variants are its cells (same settings and ids); the grid
    comes a whole block (level, seed) at a time, seed by seed; ``--levels`` narrows."""
    from acpo_trl.study.cli import main
    from acpo_trl.study.grids import DRIFT_LEVELS, PAPER_METHODS, build_grid, drift_grid
    from acpo_trl.study.runner import block

    specs = drift_grid(seeds=range(2))
    assert len(specs) == 3 * 5 * 2 * 2 and len({s.run_id for s in specs}) == len(specs)
    committed = {s.run_id: s for s in build_grid(tasks=("add2",), methods=PAPER_METHODS, uprs=(2, 16), seeds=range(2))}
    extreme = [s for s in specs if s.lr == DRIFT_LEVELS[0].lr]
    assert all(committed[s.run_id] == s for s in extreme if s.run_id in committed)
    new = {s.run_id.split("/")[1] for s in extreme if s.run_id not in committed}
    assert new == {"acpo-alpha1-clip0.05-0.5", "acpo_log"}  # the two variants the committed grid did not have
    blocks = [block(s) for s in specs]
    assert [b for i, b in enumerate(blocks) if i == 0 or blocks[i - 1] != b] == sorted(
        set(blocks), key=lambda b: (b[1], blocks.index(b)))  # each block contiguous, seeds in order
    assert {s.run_id.split("/")[1] for s in specs} == {"acpo", "acpo-alpha1-clip0.05-0.5", "acpo_log", "dapo", "cispo"}

    assert main(["plan", "--drift", "--levels", "between", "--seeds", "1", "--out", "/nonexistent"]) == 0
    assert capsys.readouterr().out.startswith("10 runs (10 to do)")  # one level: 5 variants x 2 uprs
    with pytest.raises(SystemExit) as err:
        main(["plan", "--levels", "between", "--out", "/nonexistent"])
    assert err.value.code == 2 and "--levels: only the drift grid" in capsys.readouterr().err


def test_a_machine_that_is_another_testbed_runs_only_blocks_without_the_others_runs(tmp_path, monkeypatch, capsys):
    """Resuming where the check's rerun does not reproduce: the finished runs' blocks (level, seed) are left, the
    untouched ones run; a block this machine began (its own warm-up) stays open. Nothing runnable, or the same
    warm-up giving another run (the kernels differ after the warm-up), is refused in one line."""
    from acpo_trl.utils.cli_errors import UserError
    from acpo_trl.study import cli
    from acpo_trl.study.grids import drift_grid
    from acpo_trl.study.runner import TestbedCheck, block, open_blocks

    specs = drift_grid(seeds=range(3))

    def finish(spec, digest):
        run_dir = tmp_path / "runs" / spec.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "result.json").write_text(json.dumps({} if digest is None else {"warmup_digest": digest}))

    for spec in specs:
        if spec.seed == 0 or (spec.seed == 1 and spec.method == "dapo"):
            finish(spec, None)  # another machine's, made before warm-ups were recorded
    mine = [s for s in specs if s.seed == 2 and s.lr == 5e-5]
    finish(mine[0], "b" * 12)  # a block this machine began
    runnable, closed = open_blocks(specs, tmp_path, "b" * 12)
    assert {block(s) for s in runnable} == {block(s) for s in specs if s.seed == 2}
    assert closed == sorted({block(s) for s in specs if s.seed in (0, 1)})
    assert open_blocks(specs, tmp_path, "c" * 12)[0] == [s for s in specs if s.seed == 2 and s.lr != 5e-5]

    check = TestbedCheck("x", False, "b" * 12, None, "x does not reproduce here")
    monkeypatch.setattr(cli, "check_reproduces", lambda *a, **k: check)
    run, left = cli._runnable_here(specs, tmp_path, tmp_path / "warmups")
    assert run == runnable and left == sorted({block(s) for s in specs if s.seed == 1})  # seed 0's are all done
    assert "another testbed (warm-up bbbbbbbbbbbb)" in capsys.readouterr().out
    for spec in specs:
        if spec.seed == 2:
            finish(spec, "b" * 12)
    with pytest.raises(UserError, match="every unfinished run is in a block begun on another testbed"):
        cli._runnable_here(specs, tmp_path, tmp_path / "warmups")
    check = TestbedCheck("x", False, "b" * 12, "b" * 12, "x does not reproduce here")
    with pytest.raises(UserError, match="from the same warm-up"):
        cli._runnable_here(specs, tmp_path, tmp_path / "warmups")
    check = TestbedCheck("x", True, "a" * 12, None, "x reproduced bit for bit")
    assert cli._runnable_here(specs, tmp_path, tmp_path / "warmups") == (specs, [])


def test_identical_runs_and_each_bin_clip_methods_own_eps_in_the_table():
    from acpo_trl.study.table import identical_runs_table, own_eps, write_table

    def run(method, upr, seed, evals, std=0.1, rule=None, alpha=None):
        diagnostics = {"bins": {"acpo_eps": {"1,0": 0.5}, "logratio_std": {"1,0": std}}, "grad_k": {}, "grad": {}}
        if rule:
            diagnostics["eps_rule"] = rule
        return {**_result("add2", method, upr, seed, evals[-1]), "evals": [{"step": s, "sampled": e} for s, e in
                enumerate(evals)], "rewards": [[1, 0.5]], "diagnostics": diagnostics,
                "spec": {"task": "add2", "upr": upr, "seed": seed, "method": method, "alpha": alpha, "clip": None}}

    results = [run("acpo", 2, 0, [0.4, 0.6]), run("dapo", 2, 0, [0.4, 0.6]),  # seed 0: identical
               run("acpo", 2, 1, [0.4, 0.6]), run("dapo", 2, 1, [0.4, 0.7])]
    assert "| add2 | 2 | 2 | 1 | 1 |" in "\n".join(identical_runs_table(results))
    # acpo_log logged before its rule was recorded: its own eps from the log-ratio std (approximate, marked)
    assert own_eps(run("acpo_log", 16, 0, [0.4], std=0.3), 1, 0) == (pytest.approx(0.2 + 3 * 0.3), "acpo_log's own ≈")
    assert own_eps(run("acpo_log", 16, 0, [0.4], rule="logratio"), 1, 0) == (0.5, "own (log-ratio)")
    assert own_eps(run("dapo", 16, 0, [0.4]), 1, 0) == (0.5, "ACPO's (not applied)")
    assert "| acpo_log's own ≈ |" in write_table([run("acpo_log", 16, 0, [0.4, 0.5], std=0.3)])


def test_a_result_records_the_code_its_run_started_from(tmp_path):
    """``code`` is the commit when the run started, given by the caller: a commit made while a grid runs (the grid
    picks up each run's code at its start) must not be stamped on runs that started before it."""
    import json

    from acpo_trl.study.results import write_result
    from acpo_trl.study.testbed import RunSpec

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    evals = [{"step": 0, "sampled": 0.1}, {"step": 1, "sampled": 0.2}]
    result = write_result(RunSpec(), tmp_path, evals, start=0.0, code="0123456789ab")
    assert result["code"] == "0123456789ab"
    assert json.loads((tmp_path / "result.json").read_text())["code"] == "0123456789ab"


# A launcher that runs acpo-train and, unless resuming, dies right after optimizer step 3: a session's end.
DIES_AFTER_STEP_3 = """
import sys
import acpo_trl.train as train
from transformers import TrainerCallback

class Die(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3 and "--resume_from_checkpoint" not in sys.argv:
            raise SystemExit(9)

run = train.run
train.run = lambda *args, **kwargs: run(*args, **kwargs, callbacks=[Die()])
train.main(sys.argv[1:])
"""


def test_a_cut_short_recipe_cell_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path, tiny_dir):
    """With ``save_every``, a cell whose process died resumes from its last checkpoint: the same rewards, held-out
    evaluations and logged metrics as a run never cut, its time counted up to the checkpoint, no checkpoint left."""

    from acpo_trl.study.recipe import RecipeRunSpec

    recipe = toy_recipe(tmp_path, tiny_dir, per_device_train_batch_size=4, max_steps=6)
    cell = dict(recipe=str(recipe), method="acpo", upr=2, seed=0, eval_steps=2, save_every=2)
    whole = RecipeRunSpec(**cell).run(tmp_path / "whole")
    cut = RecipeRunSpec(**cell, launcher=("python", "-c", DIES_AFTER_STEP_3))
    with pytest.raises(RuntimeError, match="exited with 9"):
        cut.run(tmp_path / "cut")
    run_dir = tmp_path / "cut" / "runs" / cut.run_id
    assert [d.name for d in run_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    resumed = cut.run(tmp_path / "cut")
    assert resumed["resumed_at"] == [2] and "resumed_at" not in whole
    assert "--resume_from_checkpoint" in resumed["command"] and "--save_steps 2" in whole["command"]
    assert (resumed["evals"], resumed["rewards"]) == (whole["evals"], whole["rewards"])
    assert resumed["diagnostics"] == whole["diagnostics"]

    def logged(out):  # timings differ; so does transformers' train_loss, its mean over the last attempt's steps
        lines = (out / "runs" / cut.run_id / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not any(w in k for w in ("time", "second", "train_loss"))}
                for line in lines]

    assert logged(tmp_path / "cut") == logged(tmp_path / "whole")
    assert not list(run_dir.glob("checkpoint-*")) and not (run_dir / "attempts.json").exists()
    assert 0 < resumed["seconds"] and 0 < whole["peak_rss_gib"] < 64


def test_a_cells_peak_memory_is_measured_on_its_own_process():
    """``call_measuring_memory`` returns the child's exit status and its peak resident memory: what it allocated
    and touched, 0.5 GiB more than this process holds, not this process's peak nor an earlier child's."""
    import resource

    from acpo_trl.study.recipe import call_measuring_memory

    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    allocate = f"b = bytearray(int(({mine} + 0.5) * 2**30)); raise SystemExit(3)"
    with open(os.devnull, "w") as null:
        code, peak = call_measuring_memory([sys.executable, "-c", allocate], stdout=null)
        after = call_measuring_memory([sys.executable, "-c", "pass"], stdout=null)[1]
    assert code == 3 and mine + 0.5 < peak < mine + 0.6 and after < mine + 0.1


def test_a_cells_command_is_passed_a_preemption_and_the_cell_stops(tmp_path):
    """SIGTERM to the process that waits on a cell's command reaches the command, which ends as it chooses (here,
    with a line and 143, as acpo-train after its checkpoint); then StopRequested(SIGTERM), not a result, and the
    process's own handler is back."""
    import signal
    import subprocess
    import threading
    import time

    from acpo_trl.study.recipe import call_measuring_memory
    from acpo_trl.training.preemption import StopRequested

    ready, said = tmp_path / "ready", tmp_path / "said"
    child = (f"import pathlib, signal, sys, time\n"
             f"def stop(signum, frame):\n    pathlib.Path({str(said)!r}).write_text(signal.Signals(signum).name)\n"
             f"    sys.exit(143)\n"
             f"signal.signal(signal.SIGTERM, stop)\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n")

    def preempt():
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=preempt, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(StopRequested) as stop, open(os.devnull, "w") as null:
        call_measuring_memory([sys.executable, "-c", child], stdout=null)
    assert stop.value.signum == signal.SIGTERM and stop.value.code == 143
    assert said.read_text() == "SIGTERM" and time.monotonic() - start < 30
    assert signal.getsignal(signal.SIGTERM) is before
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0  # nothing left waiting on a child


def test_a_child_started_after_the_preemption_is_told_too(tmp_path):
    """A signal that comes while a child is being started (before ``add``) still reaches it: a grid starting its
    workers must not leave one running on."""
    import signal
    import subprocess

    from acpo_trl.training.preemption import PassOn, StopRequested

    with pytest.raises(StopRequested) as stop:
        with PassOn() as passing:
            os.kill(os.getpid(), signal.SIGTERM)
            child = passing.add(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
            status = child.wait(timeout=30)
    assert status == -signal.SIGTERM and stop.value.code == 143


# A grid of one recipe cell with checkpoints, run by a worker process: what `acpo-study run` does.
ONE_CELL_GRID = """
import sys
from acpo_trl.study.recipe import RecipeRunSpec
from acpo_trl.study.runner import run_grid

cell = RecipeRunSpec(sys.argv[1], method="acpo", upr=2, seed=0, eval_steps=6, save_every=6)
raise SystemExit(len(run_grid([cell], sys.argv[2], sys.argv[2] + "/cache", jobs=1)))
"""


@pytest.mark.slow
def test_a_preempted_grid_stops_its_cell_with_a_checkpoint_and_resumes_from_it(tmp_path, tiny_dir):
    """SIGTERM to the grid's process alone (a Kubernetes eviction signals the first process only): its worker and the
    worker's acpo-train stop (the cell saves its step in flight), no other run starts, and the grid exits with 143;
    the same command then finishes the cell from that checkpoint."""
    import signal
    import subprocess
    import time

    from acpo_trl.study.recipe import RecipeRunSpec

    recipe = toy_recipe(tmp_path, tiny_dir, per_device_train_batch_size=4, max_steps=12)
    out = tmp_path / "grid"
    run_dir = out / "runs" / RecipeRunSpec(str(recipe), method="acpo", upr=2, seed=0).run_id
    metrics = run_dir / "metrics.jsonl"
    command = [sys.executable, "-c", ONE_CELL_GRID, str(recipe), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(tmp_path / "grid.log", "w") as log:
        grid = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text()):
            assert grid.poll() is None and time.monotonic() < deadline, (tmp_path / "grid.log").read_text()[-3000:]
            time.sleep(0.1)
        grid.send_signal(signal.SIGTERM)
        status = grid.wait(timeout=300)
    finally:
        grid.kill()
    said = (tmp_path / "grid.log").read_text()
    assert status == 143, said[-3000:]
    assert "stopped by SIGTERM: no other run was started; the same command resumes the grid" in said
    worker = (out / "workers" / "worker0.log").read_text()
    assert f"{run_dir.name} stopped by SIGTERM after " in worker, worker[-3000:]
    stopped = [line for line in (run_dir / "log.txt").read_text().splitlines() if "stopped by SIGTERM after step" in line]
    step = int(stopped[0].split("after step ")[1].split()[0])
    assert 1 <= step < 12 and (run_dir / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert not (run_dir / "result.json").exists() and not (out / ".acpo-lock").exists()
    resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_at"] == [step] and [e["step"] for e in result["evals"]] == [0, 6, 12]


def test_workers_do_not_start_a_cell_that_would_overfill_the_memory(tmp_path):
    """Cells at 2 updates per rollout measured at 13 GiB do not run two at a time within 21.6 GiB: the second worker
    takes the cell at 16 updates (4 GiB) instead, then waits until the first cell at 2 ends; a cell runs alone
    whatever it needs, and an unmeasured kind counts nothing."""
    import yaml

    from acpo_trl.study.recipe import RecipeRunSpec
    from acpo_trl.study.runner import WAIT, next_spec

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "unused", "max_steps": 4}))
    out, logs = tmp_path / "out", []

    def cell(upr, seed, rollout=None):
        return RecipeRunSpec(str(recipe), upr=upr, seed=seed, **({"rollout": rollout, "rollouts": 2} if rollout else {}))

    def finish(spec, peak=None):
        run_dir = out / "runs" / spec.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "result.json").write_text(json.dumps({"spec": spec.to_json(), "peak_rss_gib": peak}))

    finish(cell(2, 0), 13.0)
    finish(cell(16, 0), 4.0)
    queue = [cell(2, 1), cell(2, 2), cell(16, 1), cell(2, 3, rollout=64)]

    def take(budget=21.6, session="one"):
        return next_spec(queue, out, session, budget, log=logs.append)

    assert take() == cell(2, 1)
    assert take() == cell(16, 1)
    assert take() == cell(2, 3, rollout=64)  # another rollout size: not measured yet
    assert take() == WAIT and logs == [f"waiting for memory: {cell(2, 2).run_id} needs ~13.0 GiB, 17.0 of 21.6 GiB "
                                       "held by 3 run(s) in flight"]
    finish(cell(2, 1), 12.0)
    assert take() == cell(2, 2)
    for spec in queue:
        finish(spec)
    assert take() is None
    assert next_spec([cell(2, 4)], out, "two", 5.0, log=logs.append) == cell(2, 4)  # alone, though over the budget


def test_long_task_variants_are_fixed_from_the_committed_drift_measurement():
    """The wide fixed clip's epsilon and the frozen bin-wise ranges are ACPO alpha 3's ranges in the committed drift
    measurement of the running sum (updates k >= 1 of a 16-update rollout): per bin, and weighted by token share."""
    import json
    from pathlib import Path

    from acpo_trl.study.grids import LONG_TASK_BIN_RANGES, LONG_TASK_MEAN_RANGE, LONG_TASK_RECIPE

    drift = json.loads((Path(__file__).parents[1] / "study/running_sum/drift/drift.json").read_text())
    assert drift["settings"] == {"recipe": LONG_TASK_RECIPE, "updates_per_rollout": 16, "rollouts": 4, "seed": 0,
                                 "rollout": 64}
    bins = drift["runs"]["1e-06"]["bins"]
    eps, share = bins["acpo_eps"], bins["token_frac"]
    cells = [(k, b) for k in range(1, 16) for b in range(5)]
    per_bin = [sum(eps[f"{k},{b}"] for k in range(1, 16)) / 15 for b in range(5)]
    weighted = sum(eps[f"{k},{b}"] * share[f"{k},{b}"] for k, b in cells) / sum(share[f"{k},{b}"] for k, b in cells)
    assert LONG_TASK_BIN_RANGES == tuple(round(x, 2) for x in per_bin)
    assert LONG_TASK_MEAN_RANGE == round(weighted, 2)
    assert max(eps.values()) < 1  # level b: ACPO's mean range stays below 1 at every (update, bin)


def test_long_task_grid_orders_by_priority_and_adds_dapo_at_2_updates_by_the_rule(tmp_path):
    """ACPO alpha 3 at 2 and 16, DAPO and the wide clip at 16 seed-major, then DCPO, then the frozen bin-wise clip
    (6 seeds); DAPO at 2 updates per rollout joins for a seed once its ACPO run there is finished and moved a token
    outside [0.8, 1.2]. Every cell samples 8 rollouts of 64, is evaluated before and after only, checkpoints every 2
    rollouts and runs the gradient diagnostics on the last block."""
    from acpo_trl.study.grids import long_task_grid
    from acpo_trl.recipe import make_parser

    specs = long_task_grid()
    assert len(specs) == 4 * 8 + 8 + 6 and len({s.run_id for s in specs}) == len(specs)
    assert [(s.variant, s.upr, s.seed) for s in specs[:5]] == [
        ("acpo", 2, 0), ("acpo", 16, 0), ("dapo", 16, 0), ("ppo_clip(epsilon=0.28)", 16, 0), ("acpo", 2, 1)]
    assert [s.method for s in specs[32:]] == ["dcpo"] * 8 + ["bin_clip"] * 6
    assert specs[-1].variant == "bin_clip(bin_clip_ranges=0.54/0.48/0.42/0.34/0.22)"
    assert specs[1].run_id == "smollm2_running_sum@lr1e-06/acpo/upr16/seed0"
    for spec in (specs[0], specs[3]):
        script_args, args, _ = make_parser().parse_args_and_config(args=spec.command(tmp_path / "cell")[3:])
        assert (script_args.task, args.learning_rate, args.max_steps) == ("running_sum", 1e-6, 8 * spec.upr)
        assert args.per_device_train_batch_size * args.steps_per_generation == 64
        assert script_args.report_eval_steps == 8 * spec.upr and args.save_steps == 2 * spec.upr
        assert args.diagnostics_grad_every == max(2, spec.upr // 2)
        assert args.diagnostics_grad_params == ["layers\\.29\\."]
    assert args.policy_loss == "ppo_clip" and args.epsilon == 0.28

    def reference(seed, moved):
        run_id = f"smollm2_running_sum@lr1e-06/acpo/upr2/seed{seed}"
        return {"run_id": run_id, "diagnostics": {"bins_max": {"moved_frac": {"1,0": moved}}}}

    more = long_task_grid(results=[reference(0, 0.0), reference(1, 0.01)])
    assert [(s.method, s.upr, s.seed) for s in more[len(specs):]] == [("dapo", 2, 1)]
    assert len(long_task_grid(seeds=2)) == 4 * 2 + 2 + 2


def test_long_task_plan_prints_each_variant_and_the_undecided_cells(tmp_path, capsys):
    from acpo_trl.study.cli import main

    assert main(["plan", "--long-task", "--seeds", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dcpo, upr 16: 2 runs" in out and "12 runs (12 to do); estimated" in out
    assert "and up to 2 runs of dapo at upr 2" in out


def test_long_task_run_adds_dapo_at_2_updates_once_the_reference_runs_decide(tmp_path, monkeypatch):
    import json

    from acpo_trl.study import cli

    calls = []

    def fake_run_grid(specs, out, cache, jobs, log):
        calls.append([s.run_id for s in specs])
        for spec in specs:
            run = out / "runs" / spec.run_id
            run.mkdir(parents=True, exist_ok=True)
            moved = {"1,0": 0.0 if spec.seed == 0 else 0.01}
            (run / "result.json").write_text(json.dumps(
                {"run_id": spec.run_id, "diagnostics": {"bins_max": {"moved_frac": moved}}}))
        return []

    monkeypatch.setattr(cli, "run_grid", fake_run_grid)
    assert cli.main(["run", "--long-task", "--seeds", "2", "--out", str(tmp_path), "--no-report"]) == 0
    first, decided = calls
    assert len(first) == 12 and decided == ["smollm2_running_sum@lr1e-06/dapo/upr2/seed1"]


def test_mechanism_section_and_figure_from_the_runs_gradient_shares_per_update_index(tmp_path):
    """Per variant and regime: the ratio std at a rollout's last update, the clip % and the gradient share per bin
    over the late updates (k >= upr / 2), the dominant bin, bins 0-1's share early and late; runs without per-k
    shares, or a group at one regime, give no section."""
    from acpo_trl.study.mechanism import low_share_by_k, mechanism_profiles, mechanism_table, plot_mechanism

    def result(variant, upr, seed, low_share):
        late = upr - 1
        shares = {f"share/bin{b}/{s}": {"0": 0.1, str(late): (low_share if b == 0 else (1 - low_share) / 4) / 2}
                  for b in range(5) for s in ("pos", "neg")}
        bins = {"ratio_std": {f"{late},{b}": 0.1 * (5 - b) * upr / 16 for b in range(5)},
                "clip_frac_pos": {f"{late},{b}": 0.5 if variant == "dapo" and b == 0 else 0.0 for b in range(5)},
                "clip_frac_neg": {f"{late},{b}": 0.0 for b in range(5)},
                "token_frac": {f"{late},{b}": 0.2 for b in range(5)}}
        return {"run_id": f"long/{variant}/upr{upr}/seed{seed}", "group": "long", "variant": variant,
                "spec": {"task": "long", "upr": upr, "seed": seed}, "diagnostics": {"bins": bins, "grad_k": shares}}

    results = [result("acpo", 2, s, 0.1) for s in range(2)] + [result("acpo", 16, s, 0.1 + 0.1 * s) for s in range(2)]
    results += [result("dapo", 16, 0, 0.6), {"run_id": "old", "group": "long", "variant": "cispo",
                                             "spec": {"task": "long", "upr": 16, "seed": 0}, "diagnostics": {"grad_k": {}}}]
    profiles = mechanism_profiles(results)
    assert set(profiles) == {("long", "acpo", 2), ("long", "acpo", 16), ("long", "dapo", 16)}
    acpo16 = profiles[("long", "acpo", 16)]
    assert acpo16["runs"] == 2 and acpo16["grad_share"][0] == pytest.approx(0.15)  # k = 15 only, not k = 0
    assert profiles[("long", "acpo", 2)]["ratio_std_last"][0] == pytest.approx(0.0625)  # at k = 1
    table = "\n".join(mechanism_table(results))
    assert "| long | `dapo` | 16 | 1 | 0.500 / 0.400 / 0.300 / 0.200 / 0.100 | 25.0 / 0.0 / 0.0 / 0.0 / 0.0 |" in table
    assert "0.60 / 0.10 / 0.10 / 0.10 / 0.10 | 0 | 0.40 → 0.70 |" in table
    assert "| 0.15 / 0.21 / 0.21 / 0.21 / 0.21 | 1 | 0.40 → 0.36 |" in table  # bins 0-1 at k = 0, then k = 15
    assert low_share_by_k(results)[("long", "acpo", 16)] == {0: pytest.approx(0.4), 15: pytest.approx(0.3625)}
    assert mechanism_table([r for r in results if r["spec"]["upr"] == 16]) == []  # one regime: nothing to compare
    (png,) = plot_mechanism(results, tmp_path)
    assert png.endswith("long_mechanism.png") and (tmp_path / "long_mechanism.png").stat().st_size > 10_000


def test_a_logging_option_does_not_take_a_run_off_the_drift_map():
    """The drift map leaves out variants with options of their own (the wide clip's epsilon), not runs whose only
    options change what is logged (the long task's ``diagnostics_grad_params``: every one of its runs)."""
    from acpo_trl.study.drift import _map_runs

    logged = {"spec": {"task": "t", "upr": 16, "options": [["diagnostics_grad_params", "layers\\.29\\."]]}}
    variant = {"spec": {"task": "t", "upr": 16, "options": [["epsilon", 0.28]]}}
    plain = {"spec": {"task": "t", "upr": 16}}
    assert _map_runs([logged, variant, plain], "t", (16,)) == [logged, plain]


def test_the_committed_grids_train_the_clips_their_runs_used(tmp_path):
    """The committed cells ran before every clip became TRL's epsilon / epsilon_high: the study's method names keep
    their values (DAPO and the entropy methods 0.2 / 0.3, DCPO 0.16 / 0.2, CISPO's mask 0.8 / 1.3 and cap 1.45), so
    that a resumed or re-run cell trains what the committed one did; their run ids and table rows are unchanged."""
    from acpo_trl.losses import epsilon_high
    from acpo_trl.study.grids import build_grid, long_task_grid, real_model_grid
    from acpo_trl.recipe import make_parser

    ran = {"dapo": (0.2, 0.3), "high_entropy": (0.2, 0.3), "low_entropy": (0.2, 0.3), "dcpo": (0.16, 0.2),
           "cispo": (0.2, 0.3), "ppo_clip": (0.2, 0.2), "ar_lopti": (0.2, 0.24)}
    specs = real_model_grid(seeds=range(1)) + long_task_grid(seeds=1)
    for spec in specs:
        if spec.method in ran and not spec.options:
            _, args, _ = make_parser().parse_args_and_config(args=spec.command(tmp_path / "c")[len(spec.launcher):])
            assert (args.epsilon, epsilon_high(args, args.policy_loss)) == ran[spec.method], spec.run_id
            assert "/" + spec.method + "/" in spec.run_id + "/" and spec.variant == spec.method
    cispo = next(s for s in specs if s.method == "cispo")
    _, args, _ = make_parser().parse_args_and_config(args=cispo.command(tmp_path / "c")[len(cispo.launcher):])
    assert args.policy_loss == "masked_cispo" and args.cispo_clip_max == 1.45
    testbed = {s.method: s for s in build_grid(tasks=("add1",), seeds=(0,), uprs=(2,), alphas=())}
    for method in ("dapo", "high_entropy", "low_entropy"):
        assert testbed[method].config_overrides() == {"epsilon_high": 0.3}


@pytest.mark.slow
def test_the_coupling_measurement_spreads_paired_differences_of_kept_models(tmp_path, tiny_dir, capsys):
    """`acpo-study coupling` evaluates each kept model twice with today's sampler (its seed, and another) and takes
    the coupled draw from the run's own evaluation, then gives each scheme's spread of the paired differences."""
    import shutil

    from acpo_trl.study.cli import main
    from acpo_trl.study.coupling import spread_table

    recipe = toy_recipe(tmp_path, tiny_dir, num_eval_tasks=4)
    out = tmp_path / "grid"
    for method in ("acpo", "unclipped"):
        for seed in (0, 1):
            run_id = f"toy_recipe/{method}/upr2/seed{seed}"
            (out / "runs" / run_id).mkdir(parents=True)
            result = {"run_id": run_id, "variant": method, "spec": {"method": method, "seed": seed, "upr": 2,
                                                                     "recipe": str(recipe), "task": "toy_recipe"},
                      "correct": {"before": [0, 1, 2, 0], "after": [seed, 2, 1, int(method == "acpo")]}}
            (out / "runs" / run_id / "result.json").write_text(json.dumps(result))
            shutil.copytree(tiny_dir, out / "models" / run_id)
    assert main(["coupling", "--out", str(out), "--pairs", "acpo:unclipped", "--limit", "4"]) == 0
    table = (out / "coupling.md").read_text()
    for scheme in ("independent", "per batch", "coupled"):
        assert f"| `acpo` - `unclipped` | 2 | {scheme} |" in table
    # the coupled differences come from the runs' own counts: seed 0 (0+2+1+1) - (0+2+1+0), seed 1 likewise: +1/8
    assert "| coupled | +12.50 | 0.00 |" in table
    stored = json.loads((out / "coupling.json").read_text())
    assert stored["k"] == 2 and len(stored["models"]) == 4
    # identical models at the same seed draw the same samples: today's per-batch differences are 0
    assert "| per batch | +0.00 | 0.00 |" in table
    one_seed = {run_id: m for run_id, m in stored["models"].items() if m["seed"] == 0}  # a grid's first session
    rows = spread_table(one_seed, [("acpo", "unclipped")], stored["k"])[2:]
    assert len(rows) == 3 and all(row.endswith("| – | n/a (an SD needs 2 seeds) |") for row in rows)
    capsys.readouterr()
    assert main(["coupling", "--out", str(out), "--pairs", "acpo:unclipped", "--limit", "4"]) == 0  # resumable
    assert "8 evaluations stored" in capsys.readouterr().out
    # coupling.json is the store: with the models and their samples gone (another session), the same table
    shutil.rmtree(out / "models")
    shutil.rmtree(out / "coupling" / "evals")
    (out / "coupling.md").unlink()
    assert main(["coupling", "--out", str(out), "--pairs", "acpo:unclipped", "--limit", "4"]) == 0
    assert (out / "coupling.md").read_text() == table
    with pytest.raises(SystemExit) as err:  # counts on 4 problems do not pair with counts on 3
        main(["coupling", "--out", str(out), "--pairs", "acpo:unclipped", "--limit", "3"])
    assert err.value.code == 2 and "give --limit 4" in capsys.readouterr().err
