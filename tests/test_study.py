"""The study: testbed problems, reward and teacher; the table (drops, ranks, collapses); the quick grid through
the real command (worker processes), its resumption, and an interrupted run redone alone."""

from __future__ import annotations

import json
import random

import pytest


def test_testbed_split_reward_and_teacher():
    from acpo_trl.study.testbed import addition_reward, noisy_teacher, task_problems

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
    from acpo_trl.study.table import summarize, write_table

    results = [_result("add1", "acpo", 2, s, 0.8) for s in range(2)] + [_result("add1", "acpo", 8, s, 0.6) for s in range(2)]
    results += [_result("add1", "dapo", 2, 0, 0.7), _result("add1", "dapo", 2, 1, 0.5),
                _result("add1", "dapo", 8, 0, 0.7), _result("add1", "dapo", 8, 1, 0.0, collapsed=True)]
    rows = summarize(results)["add1"]["rows"]
    assert rows["acpo"]["regimes"][2]["final"] == pytest.approx((0.8, 0.0))
    assert rows["dapo"]["regimes"][2]["final"][1] == pytest.approx(0.1414, abs=1e-3)  # sample sd
    assert rows["acpo"]["drop"][8] == pytest.approx(0.25)
    assert rows["acpo"]["avg_rank"] == 1.0 and rows["dapo"]["avg_rank"] == 2.0
    assert rows["dapo"]["regimes"][8]["collapsed"] == 1
    assert summarize(results, exclude_collapsed=True)["add1"]["rows"]["dapo"]["regimes"][8]["final"][0] == 0.7
    text = write_table(results)
    assert "1/2" in text and "Without the collapsed runs" in text and "+25.0%" in text


def test_collapse_rule():
    from acpo_trl.study.runner import collapsed

    assert collapsed([(s, 0.5 if s < 100 else 0.0) for s in range(1, 201, 8)], 200)
    assert not collapsed([(s, 0.0 if s < 190 else 0.1) for s in range(1, 201, 8)], 200)
    assert not collapsed([(200, 0.0)], 200)  # one rollout is not "stayed"


@pytest.mark.slow
def test_quick_grid_runs_resumes_and_redoes_only_an_interrupted_run(tmp_path, capsys):
    from acpo_trl.study.cli import main
    from acpo_trl.study.runner import quick_grid, run_grid

    out = tmp_path / "study"
    assert main(["run", "--quick", "--out", str(out), "--plots", "some"]) == 0
    specs = quick_grid()
    results = {s.run_id: json.loads((out / "runs" / s.run_id / "result.json").read_text()) for s in specs}
    assert {r["variant"] for r in results.values()} == {"acpo", "dapo", "acpo(alpha=1)"}
    for r in results.values():
        assert [e["step"] for e in r["evals"]] == [0, 2, 4] and 0 <= r["final_sampled"] <= 1
    metrics = (out / "runs" / "add1/acpo/upr2/seed0/metrics.jsonl").read_text()
    assert "diag/k1/bin" in metrics and "grad/norm_used" in metrics  # second update of a rollout is logged as k = 1
    table = (out / "table.md").read_text()
    assert "`acpo(alpha=1)`" in table and "final acc, upr 2" in table
    assert (out / "plots" / "add1_learning_curves.png").exists()
    assert list((out / "plots").glob("add1_acpo_upr2_seed0_bins.png"))

    capsys.readouterr()
    assert main(["run", "--quick", "--out", str(out), "--no-report"]) == 0  # nothing left to do
    assert "0 to run" in capsys.readouterr().out

    # An interrupted grid: one run lost its result (killed mid-run); only that one is redone.
    lost = specs[0]
    (out / "runs" / lost.run_id / "result.json").unlink()
    stamps = {s.run_id: (out / "runs" / s.run_id / "result.json").stat().st_mtime_ns for s in specs[1:]}
    assert run_grid(specs, out, out / "warmups", jobs=0, log=lambda m: None) == []
    assert (out / "runs" / lost.run_id / "result.json").exists()
    assert stamps == {s.run_id: (out / "runs" / s.run_id / "result.json").stat().st_mtime_ns for s in specs[1:]}
