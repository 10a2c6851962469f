"""Reward throughput: completions scored per second, one process vs the parallel path where one exists.

    python benchmarks/rewards.py [--countdown N] [--hitab N] [--math N] [--math-symbolic N] [--math-hostile N]
                                 [--batch B] [--workers W] [--orz FILE]

Completions are realistic: a few hundred characters of reasoning ending in the answer, half of them correct.
Countdown tasks are generated; HiTab golds are the committed test fixture's; math completions carry NEW answers
(fresh random values, a fresh reward instance per run, so no cache helps): "math mixed" has 30% radicals and
polynomials that need math-verify and 70% integers, fractions and decimals that the reward's fast check decides;
"math symb." is all math-verify checks. Rewards are called in TRL-sized batches of ``--batch`` completions; the math
reward's checker processes are started before timing; its serial figure is one checker process (it never checks
in the calling process), the parallel one ``--workers`` processes. Countdown and HiTab have no parallel path.
"math host." is one batch of ``--math-hostile`` completions whose answers hang sympy (power towers, nested
exponents, nested braces, 20,000-term sums...; fresh sizes each). Below the table, the math reward's worst case for
one completion: a call with a hanging answer, then the next call (which paid for the checker's restart before the
warm spare), for the issue's reproduction and for a hang the screen lets through; and how many gold answers the
screen rejects (it must be none): the six evaluation sets, and the ORZ file given with ``--orz``.
Targets on 2 cores: Countdown and HiTab 20,000/s, math 500/s, 64 hostile completions in 2 s (32/s), any one
completion decided within 1 s.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from acpo_trl.data.countdown import generate_countdown
from acpo_trl.data.math import BENCHMARKS, load_math_eval, load_orz
from acpo_trl.rewards.countdown import countdown_reward, solve_countdown
from acpo_trl.rewards.hitab import hitab_reward
from acpo_trl.rewards.math import MathReward, gold_answer, screen_answer

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


def hostile_answer(i: int, rng: random.Random) -> str:
    """Answers that keep sympy busy for seconds to hours, with fresh sizes (so no cache helps)."""
    k = rng.randint(2, 99)
    return [
        f"{k}^{{{k}^{{{k}^{{{k}}}}}}}",  # power tower
        "x^{" * (k + 100) + "2" + "}" * (k + 100),  # nested exponents
        "{" * (k + 1000) + str(k) + "}" * (k + 1000),  # nested braces
        "+".join(["1"] * (k + 20_000)),  # a long sum
        f"(1+x)^{{10^{{{k}}}}}",  # a polynomial to expand
        f"{k}^{{{k}^{{{k}}}}}",  # a short tower
        "\\frac{1}{" * (k + 200) + "2" + "}" * (k + 200),  # nested fractions
        "\\sqrt{" * (k + 7) + str(k) + "}" * (k + 7),  # nested roots
    ][i % 8]


def hostile_batch(n: int, rng: random.Random):
    answers = [hostile_answer(i, rng) for i in range(n)]
    completions = [f"<think>{REASONING.format(detail='')}</think> The answer is $\\boxed{{{a}}}$." for a in answers]
    return completions, [str(rng.randint(1, 999)) for _ in answers]


def worst_case(hang: str) -> tuple[float, float]:
    """Seconds of a call with one completion whose answer hangs sympy, and of the next call (one completion)."""
    reward = MathReward(num_workers=1)
    try:
        reward(completions=["\\boxed{x(x+1)}"], answer=["x^2+x"])  # start the checker
        time.sleep(5.0)  # a training step generates between two reward calls: anything started meanwhile is ready
        start = time.perf_counter()
        reward(completions=[f"\\boxed{{{hang}}}"], answer=["42"])
        middle = time.perf_counter()
        reward(completions=["\\boxed{\\sqrt{3}}"], answer=["42"])
        return middle - start, time.perf_counter() - middle
    finally:
        reward.close()


def screened_golds(orz: str | None) -> list[tuple[str, int, int]]:
    """(source, gold answers, how many the screen rejects) for the evaluation sets and the ORZ file."""
    sources = {"6 evaluation sets": [a for name in BENCHMARKS for a in load_math_eval(name)["answer"]]}
    if orz:
        sources["ORZ file"] = load_orz(orz)["answer"]
    return [(name, len(golds), sum(screen_answer(gold_answer(g) or "") is not None for g in golds))
            for name, golds in sources.items()]


def throughput(reward, completions, columns, batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(completions), batch):
        reward(prompts=None, completions=completions[i : i + batch],
               **{k: v[i : i + batch] for k, v in columns.items()})
    return len(completions) / (time.perf_counter() - start)


def math_throughput(n: int, symbolic_share: float | None, batch: int, workers: int, seed: int) -> float:
    """Math completions per second; ``symbolic_share`` None: hostile completions."""
    rng = random.Random(seed)  # new answers for each run
    completions, answers = hostile_batch(n, rng) if symbolic_share is None else math_batch(n, symbolic_share, rng)
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
    parser.add_argument("--math-hostile", type=int, default=64, help="math completions that hang sympy, one batch")
    parser.add_argument("--batch", type=int, default=256, help="completions per reward call")
    parser.add_argument("--workers", type=int, default=2, help="checker processes of the math parallel path")
    parser.add_argument("--orz", help="an ORZ-57K JSON file: also count its gold answers that the screen rejects")
    args = parser.parse_args()
    rows = [
        ("countdown", args.countdown, throughput(countdown_reward, *countdown_batch(args.countdown), args.batch),
         None, 20_000),
        ("hitab", args.hitab, throughput(hitab_reward, *hitab_batch(args.hitab), args.batch), None, 20_000),
    ]
    for name, n, share, target in (("math mixed", args.math, 0.3, 500), ("math symb.", args.math_symbolic, 1.0, 500),
                                   ("math host.", args.math_hostile, None, 32)):
        batch = args.batch if share is not None else n
        rows.append((name, n, math_throughput(n, share, batch, 1, seed=1),
                     math_throughput(n, share, batch, args.workers, seed=2), target))
    hangs = [(r"10^{10^{10^{10}}}", "the issue's reproduction"), (r"(10^{8})!", "a hang the screen lets through")]
    latencies = [(hang, why, *worst_case(hang)) for hang, why in hangs]
    print(f"{'reward':<10} {'completions':>11} {'serial /s':>11} {f'{args.workers} workers /s':>13} {'target /s':>10}")
    for name, n, single, parallel, target in rows:
        parallel_text = "-" if parallel is None else f"{parallel:,.0f}"
        print(f"{name:<10} {n:>11,} {single:>11,.0f} {parallel_text:>13} {target:>10,}")
    print("\nmath reward, one hanging completion then the next call (s), target 1.0 each:")
    for hang, why, first, second in latencies:
        print(f"  {hang:<20} {first:6.2f} then {second:5.2f}   ({why})")
    for source, n, rejected in screened_golds(args.orz):
        print(f"screen: rejects {rejected} of {n:,} gold answers of the {source}")


if __name__ == "__main__":
    main()
