r"""Running sums shown step by step: a task with long, worked completions whose only reward is the final answer.

Format. The question is "What is n1 + n2 + ... + nm?" (m = ``terms`` numbers, each drawn uniformly from
``1..max_term``; with ``unique``, m different numbers); a worked answer adds them left to right, one step per
number, and boxes the total (``worked_solution``), in one of three styles:

    What is 3 + 4 + 2 + 5?
    pairs:    3 + 4 = 7, 7 + 2 = 9, 9 + 5 = 14. \boxed{14}
    rewrite:  3 + 4 + 2 + 5
              = 7 + 2 + 5
              = 9 + 5
              = 14. \boxed{14}
    varied:   3 + 4 = 7, adding 2 to 7 gives 9, 9 plus 5 is 14, so the sum is \boxed{14}.

``pairs`` is the issue's running sum: each step fetches its next number from the question (which a small model
finds most easily when no number occurs twice: ``unique``). ``rewrite`` restates the sum with its first two numbers
replaced by their sum, one line per step, so each step copies the rest of the previous line. ``varied`` is
``pairs`` with each step, each link between steps and the ending written in one of a few equivalent phrasings
(``VARIED_STEPS``, ``VARIED_LINKS``, ``VARIED_ENDINGS``), drawn uniformly per problem from a seed that the problem's
numbers fix: a model that has learned the style still chooses among equally right words at every step, as a
reasoning trace does, so its completions hold low-probability tokens that are not errors.

With ``shots`` > 0 (chat template) the question follows that many solved examples of the same size, in the same
style, as earlier turns of the conversation (user: the question, assistant: its worked answer), and no instruction;
without examples the question carries an instruction that shows the format on a short example. The examples are
the same in every prompt (drawn from their own fixed seed), so the prompts share their prefix
(``share_prompt_prefix``). The held-out problems are drawn with another seed and exclude the training problems and
the examples (``RunningSum.datasets``).

Rule. Only the final answer is rewarded: ``math_reward`` compares the completion's last ``\boxed{}`` with the total
(the ``answer`` column); the steps are not checked, so a completion that skips or botches them but boxes the right
total scores 1, and one without a box scores 0.

Length. SmolLM2's tokenizer splits numbers into digits: in ``pairs`` a step "9 + 5 = 14, " is 9-10 tokens, so m
numbers give about 9.5 (m - 1) + 8 tokens (the box and the end of turn); in ``rewrite`` line j (j = 0..m-1) is
about 2 (m - j) + 2 tokens, about m^2 + 3m + 6 in all; ``varied`` takes about 64 tokens for 6 numbers in 1..9.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .templates import build_prompt

EXAMPLES_SEED = 20_260_044  # the solved examples' own seed: the same examples whatever the run's seed
STYLES = ("pairs", "rewrite", "varied")
VARIED_STEPS = ("{t} + {n} = {s}", "{t} plus {n} is {s}", "{t} and {n} make {s}", "adding {n} to {t} gives {s}")
VARIED_LINKS = (", ", "; ", ", then ", ".\n")
VARIED_ENDINGS = (". \\boxed{{{s}}}", ". The total is \\boxed{{{s}}}.", ", so the sum is \\boxed{{{s}}}.")
MAX_SHOTS = 8


def question(numbers) -> str:
    """ "What is n1 + n2 + ... + nm?" """
    return "What is " + " + ".join(map(str, numbers)) + "?"


def worked_solution(numbers, style: str = "pairs") -> str:
    r"""The worked answer of ``numbers`` in ``style``: ``pairs`` "n1 + n2 = s2, s2 + n3 = s3, ..., s(m-1) + nm = sm.
    \boxed{sm}"; ``rewrite`` "n1 + n2 + ... + nm\n= s2 + n3 + ... + nm\n= ...\n= sm. \boxed{sm}"; ``varied``
    the steps of ``pairs``, each phrased, linked and ended as drawn from a seed fixed by ``numbers``."""
    sums = [numbers[0]]
    for n in numbers[1:]:
        sums.append(sums[-1] + n)
    if style == "pairs":
        steps = [f"{total} + {n} = {total + n}" for total, n in zip(sums, numbers[1:])]
        return ", ".join(steps) + f". \\boxed{{{sums[-1]}}}"
    if style == "varied":
        rng = random.Random("varied-" + ",".join(map(str, numbers)))
        text = ""
        for j, (total, n) in enumerate(zip(sums, numbers[1:])):
            text += (rng.choice(VARIED_LINKS) if j else "") + rng.choice(VARIED_STEPS).format(t=total, n=n, s=total + n)
        return text + rng.choice(VARIED_ENDINGS).format(s=sums[-1])
    if style == "rewrite":
        lines = [" + ".join(map(str, [total, *numbers[j + 1:]])) for j, total in enumerate(sums)]
        return "\n= ".join(lines) + f". \\boxed{{{sums[-1]}}}"
    raise ValueError(f"ACPOScriptArguments.running_sum_style={style!r}: use one of {STYLES}.")


def instruction(style: str = "pairs") -> str:
    """The instruction of a question without solved examples: the style's format on a short example."""
    return ("Add the numbers from left to right, one step at a time, then put the total within \\boxed{}, for "
            f"example:\nWhat is 3 + 4 + 2?\n{worked_solution((3, 4, 2), style)}")


def problem_numbers(prompt) -> tuple[int, ...]:
    """The numbers of a problem, read back from its prompt (the last user turn, or the plain string's question,
    which comes before the instruction)."""
    text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
    start = text.index("What is ") + len("What is ")
    return tuple(int(n) for n in text[start:text.index("?", start)].split(" + "))


@dataclass(frozen=True)
class RunningSum:
    """One size and presentation of the task (the ``running_sum_*`` fields of ``ACPOScriptArguments``), checked at
    construction: ``terms`` numbers drawn from 1..``max_term`` (with ``unique``, no number twice in a problem),
    ``shots`` solved examples written in ``style``, prompts in ``template``."""

    terms: int = 6
    max_term: int = 9
    shots: int = 0
    style: str = "varied"
    unique: bool = False
    template: str = "chat"

    def __post_init__(self):
        if self.terms < 2:
            raise ValueError(f"ACPOScriptArguments.running_sum_terms={self.terms}: a running sum needs at least 2 "
                             "numbers.")
        if self.max_term < 1:
            raise ValueError(f"ACPOScriptArguments.running_sum_max_term={self.max_term}: the numbers are drawn from "
                             "1..running_sum_max_term; give at least 1.")
        if self.unique and self.max_term < self.terms:
            raise ValueError(f"ACPOScriptArguments.running_sum_unique=True: {self.terms} different numbers need "
                             f"running_sum_max_term >= {self.terms} (it is {self.max_term}).")
        if not 0 <= self.shots <= MAX_SHOTS:
            raise ValueError(f"ACPOScriptArguments.running_sum_shots={self.shots}: must be in [0, {MAX_SHOTS}].")
        if self.shots and self.template != "chat":
            raise ValueError(f"ACPOScriptArguments.running_sum_shots={self.shots}: solved examples are earlier chat "
                             "turns; set prompt_template: chat (or running_sum_shots: 0).")
        if self.style not in STYLES:
            raise ValueError(f"ACPOScriptArguments.running_sum_style={self.style!r}: use one of {STYLES}.")

    @property
    def num_problems(self) -> int:
        """How many different problems this size has."""
        return math.perm(self.max_term, self.terms) if self.unique else self.max_term**self.terms

    def draw(self, rng: random.Random) -> tuple[int, ...]:
        if self.unique:
            return tuple(rng.sample(range(1, self.max_term + 1), self.terms))
        return tuple(rng.randint(1, self.max_term) for _ in range(self.terms))

    def example_problems(self) -> list[tuple[int, ...]]:
        """The numbers of the solved examples (their own fixed seed, so every prompt shares them)."""
        rng = random.Random(f"{EXAMPLES_SEED}-{self.terms}-{self.max_term}" + ("-unique" if self.unique else ""))
        return [self.draw(rng) for _ in range(self.shots)]

    def prompt(self, numbers):
        """The prompt of one problem: the solved examples as earlier chat turns, then the question; without
        examples, the question and the instruction (one chat turn, or a plain string with ``template="base"``)."""
        if not self.shots:
            return build_prompt(question(numbers), instruction(self.style), self.template)
        history = []
        for example in self.example_problems():
            history += [{"role": "user", "content": question(example)},
                        {"role": "assistant", "content": worked_solution(example, self.style)}]
        return history + [{"role": "user", "content": question(numbers)}]

    def problems(self, num_tasks: int, seed: int, distinct: bool = False, exclude=()) -> list[tuple[int, ...]]:
        """``num_tasks`` problems drawn with ``seed``; with ``distinct``, no problem twice and none in ``exclude``."""
        rng = random.Random(seed)
        if not distinct:
            return [self.draw(rng) for _ in range(num_tasks)]
        seen = set(exclude)
        available = self.num_problems - len(seen)
        if num_tasks > available:
            raise ValueError(f"ACPOScriptArguments.num_eval_tasks={num_tasks}: only {available} running sums of "
                             f"{self.terms} numbers in 1..{self.max_term} are left for a held-out set; ask for fewer "
                             "or raise running_sum_terms / running_sum_max_term.")
        problems = []
        while len(problems) < num_tasks:
            numbers = self.draw(rng)
            if numbers not in seen:
                seen.add(numbers)
                problems.append(numbers)
        return problems

    def dataset(self, problems):
        """The ``prompt`` and ``answer`` (the total) columns of ``problems``."""
        from datasets import Dataset  # deferred: the datasets library is heavy, and only building a dataset needs it

        return Dataset.from_dict({"prompt": [self.prompt(p) for p in problems],
                                  "answer": [str(sum(p)) for p in problems]})

    def held_out_problems(self, num_train: int, num_eval: int, seed: int, eval_seed_offset: int = 10_000):
        """``(train, held_out)`` problems of a run with ``seed``: ``num_train`` drawn with ``seed``, and ``num_eval``
        distinct ones drawn with ``seed + eval_seed_offset`` that are neither training problems nor solved examples."""
        train = self.problems(num_train, seed)
        exclude = set(train) | set(self.example_problems())
        return train, self.problems(num_eval, seed + eval_seed_offset, distinct=True, exclude=exclude)

    def datasets(self, num_train: int, num_eval: int, seed: int, eval_seed_offset: int = 10_000):
        """``(train, held_out)`` datasets of a run with ``seed`` (``held_out_problems``)."""
        train, held_out = self.held_out_problems(num_train, num_eval, seed, eval_seed_offset)
        return self.dataset(train), self.dataset(held_out)

    def warmup_dataset(self, num_examples: int, seed: int, exclude=()):
        """``num_examples`` distinct problems drawn with ``seed``, none in ``exclude`` (the held-out problems of the
        runs that will start from the warm-up), as prompt-completion rows for a supervised warm-up: the task's
        prompt and its worked answer as the assistant's turn."""
        from datasets import Dataset  # deferred: the datasets library is heavy, and only building a dataset needs it

        problems = self.problems(num_examples, seed, distinct=True, exclude=exclude)
        return Dataset.from_dict({
            "prompt": [self.prompt(p) for p in problems],
            "completion": [[{"role": "assistant", "content": worked_solution(p, self.style)}] for p in problems],
        })
