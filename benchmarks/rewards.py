"""Reward throughput: completions scored per second, one process vs the parallel path where one exists.

    python benchmarks/rewards.py [--countdown N] [--hitab N] [--math N] [--math-symbolic N] [--batch B] [--workers W]

Completions are realistic: a few hundred characters of reasoning ending in the answer, half of them correct.
Countdown tasks are generated; HiTab golds are the committed test fixture's; math completions carry NEW answers
(fresh random values, a fresh reward instance per run, so no cache helps): "math mixed" has 30% radicals and
polynomials that need math-verify and 70% integers, fractions and decimals that the reward's fast check decides;
"math symb." is all math-verify checks. Rewards are called in TRL-sized batches of ``--batch`` completions; the math
reward's checker processes are started before timing; its serial figure is one checker process (it never checks
in the calling process), the parallel one ``--workers`` processes. Countdown and HiTab have no parallel path.
Targets on 2 cores: Countdown and HiTab 20,000/s, math 500/s.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from acpo_trl.data.countdown import generate_countdown
from acpo_trl.rewards.countdown import countdown_reward, solve_countdown
from acpo_trl.rewards.hitab import hitab_reward
from acpo_trl.rewards.math import MathReward

HITAB_SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hitab" / "test_samples.jsonl"
REASONING = (
    "Let me work through this carefully. First I restate what is asked and list the quantities that matter. "
    "Then I check each candidate step by step, discard the ones that do not fit, and verify the remaining one "
    "against every condition before writing it down. {detail} So the final answer follows. "
)


def countdown_batch(n: int):
    tasks = generate_countdown(64, seed=0)
    rows = [(t, nums, solve_countdown(nums, t)) for t, nums in zip(tasks["target"], tasks["nums"])]
    completions, targets, nums_column = [], [], []
    for i in range(n):
        target, nums, solution = rows[i % len(rows)]
        equation = solution if i % 2 == 0 else " + ".join(map(str, nums))  # mostly wrong
        detail = f"Trying {' and '.join(map(str, nums))} with + - * / to reach {target}."
        completions.append(f"<think>{REASONING.format(detail=detail)}</think>\n<answer> {equation} </answer>")
        targets.append(target)
        nums_column.append(nums)
    return completions, {"target": targets, "nums": nums_column}


def hitab_batch(n: int):
    golds = [json.loads(line)["answer"] for line in HITAB_SAMPLES.read_text().splitlines()]
    completions, answers = [], []
    for i in range(n):
        gold = golds[i % len(golds)]
        items = gold if i % 2 == 0 else [a + 0.1 if isinstance(a, (int, float)) else a + "s" for a in gold]
        detail = "Reading the row and column headers, the matching cells are " + ", ".join(map(str, items)) + "."
        completions.append(f"<think>{REASONING.format(detail=detail)}</think> <answer> "
                           + " | ".join(map(str, items)) + " </answer>")
        answers.append([str(a) for a in gold])
    return completions, {"answer": answers}


def math_batch(n: int, symbolic_share: float, rng: random.Random):
    """New answers (fresh random values, so no cache helps): a ``symbolic_share`` of radicals and polynomials that
    only math-verify decides, the rest integers, fractions and decimals that the reward's fast check decides."""
    completions, answers = [], []
    for i in range(n):
        a, b, c = rng.randint(2, 10**4), rng.randint(2, 10**4), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
        wrong = i % 2
        if rng.random() < symbolic_share:
            if rng.random() < 0.5:
                gold, pred = f"\\frac{{{a}\\sqrt{{{c}}}}}{{{b}}}", f"\\frac{{{a + wrong}}}{{{b}}}\\sqrt{{{c}}}"
            else:
                gold, pred = f"{a}x^2+{b}x", f"x({a}x+{b + wrong})"
        else:
            gold, pred = rng.choice(
                [(str(a), str(a + wrong)), (f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{2 * a + wrong}}}{{{2 * b}}}"),
                 (f"{a}.5", f"{a + wrong}.50")]
            )
        detail = f"Simplifying the expression gives {pred}."
        completions.append(f"<think>{REASONING.format(detail=detail)}</think> The answer is $\\boxed{{{pred}}}$.")
        answers.append(gold)
    return completions, answers


def throughput(reward, completions, columns, batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(completions), batch):
        reward(prompts=None, completions=completions[i : i + batch],
               **{k: v[i : i + batch] for k, v in columns.items()})
    return len(completions) / (time.perf_counter() - start)


def math_throughput(n: int, symbolic_share: float, batch: int, workers: int, seed: int) -> float:
    completions, answers = math_batch(n, symbolic_share, random.Random(seed))  # new answers for each run
    reward = MathReward(num_workers=workers, parallel_threshold=1)
    reward(completions=["\\boxed{x(x+1)}"] * workers, answer=["x^2+x"] * workers)  # start the workers
    try:
        return throughput(reward, completions, {"answer": answers}, batch)
    finally:
        reward.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--countdown", type=int, default=100_000, help="Countdown completions")
    parser.add_argument("--hitab", type=int, default=100_000, help="HiTab completions")
    parser.add_argument("--math", type=int, default=2_000, help="math completions, 30%% symbolic")
    parser.add_argument("--math-symbolic", type=int, default=500, help="math completions, all symbolic")
    parser.add_argument("--batch", type=int, default=256, help="completions per reward call")
    parser.add_argument("--workers", type=int, default=2, help="checker processes of the math parallel path")
    args = parser.parse_args()
    rows = [
        ("countdown", args.countdown, throughput(countdown_reward, *countdown_batch(args.countdown), args.batch),
         None, 20_000),
        ("hitab", args.hitab, throughput(hitab_reward, *hitab_batch(args.hitab), args.batch), None, 20_000),
    ]
    for name, n, share in (("math mixed", args.math, 0.3), ("math symb.", args.math_symbolic, 1.0)):
        rows.append((name, n, math_throughput(n, share, args.batch, 1, seed=1),
                     math_throughput(n, share, args.batch, args.workers, seed=2), 500))
    print(f"{'reward':<10} {'completions':>11} {'serial /s':>11} {f'{args.workers} workers /s':>13} {'target /s':>10}")
    for name, n, single, parallel, target in rows:
        parallel_text = "-" if parallel is None else f"{parallel:,.0f}"
        print(f"{name:<10} {n:>11,} {single:>11,.0f} {parallel_text:>13} {target:>10,}")


if __name__ == "__main__":
    main()
