"""Training tasks by name: each builds the train set, a held-out set and the reward functions.

    countdown  Countdown: ``dataset_name`` (local jsonl/json/parquet or Hub id) or, when absent, tasks generated
               by ``generate_countdown`` (seeded); reward ``CountdownReward(format_score)``.
    math       ORZ-57K (``dataset_name``: local JSON or Hub id, default the Hub mirror); held out: MATH500
               (shipped with the package); reward ``math_reward`` (math-verify on the last \\boxed{}).
    hitab      HiTab samples (``dataset_name``) with ``hitab_tables_dir``; held out: ``eval_dataset_name``;
               reward ``hitab_reward``.
    addition   "What is a + b?" problems with n-digit operands (generated, seeded); reward ``math_reward``.
    toy        The toy letter task of ``acpo_trl.toy`` (for the tiny local model).
"""

from __future__ import annotations

import functools
import logging
import operator
import random
from dataclasses import dataclass, field
from typing import Callable

from trl import ScriptArguments

from .number_checks import AT_LEAST_ONE, NON_NEGATIVE, Range, check_numbers

logger = logging.getLogger(__name__)

# Checked at construction (acpo_trl/number_checks.py; report_eval_steps has its own check).
SCRIPT_RANGES = {
    "num_train_tasks": AT_LEAST_ONE, "num_eval_tasks": AT_LEAST_ONE, "countdown_min_numbers": Range(2),
    "countdown_max_numbers": Range(2), "countdown_format_score": NON_NEGATIVE, "addition_digits": AT_LEAST_ONE,
    "addition_shots": NON_NEGATIVE, "max_prompt_length": AT_LEAST_ONE, "eval_k": AT_LEAST_ONE,
    "eval_temperature": NON_NEGATIVE,
}  # fmt: skip


@dataclass
class ACPOScriptArguments(ScriptArguments):
    """Script arguments of ``acpo-train``: TRL's ``ScriptArguments`` plus the task and the run's outputs.

    Parameters:
        task (`str`, defaults to `"countdown"`): one of `countdown`, `math`, `hitab`, `addition`, `multiplication`,
            `toy`.
        prompt_template (`str`, defaults to `"base"`): `"base"` (ACPO's template, no chat template) or `"chat"`.
        num_train_tasks (`int`, defaults to `2048`): generated tasks (countdown without `dataset_name`, addition).
        num_eval_tasks (`int`, defaults to `64`): held-out problems for the before/after report.
        countdown_min_numbers / countdown_max_numbers (`int`, defaults to `3` / `4`): size of generated tasks.
        countdown_format_score (`float`, defaults to `0.0`): Countdown format credit (0.1 = TinyZero).
        addition_digits (`int`, defaults to `1`): digits of each operand of the addition and multiplication tasks.
        addition_shots (`int`, defaults to `0`): addition and multiplication tasks, chat template: this many solved
            examples (at most 6) as earlier turns of the conversation before each question, in place of the
            instruction.
        hitab_tables_dir (`str`, *optional*): folder of HiTab table JSON files.
        eval_dataset_name (`str`, *optional*): held-out data (HiTab samples, or a Countdown file).
        max_prompt_length (`int`, *optional*): drop training prompts longer than this many tokens (the paper: 1024),
            counted after the chat template when the prompt is conversational.
        report (`bool`, defaults to `False`): evaluate the held-out set before and after training and write
            `metrics.jsonl`, `training_curves.png` and `report.md` in `output_dir` (with `diagnostics: true`, also
            `diagnostics_bins.png` and, when the gradient check runs, `diagnostics_gradient.png`). An earlier run's
            files there are replaced as this run writes its own (`metrics.jsonl` once training begins, the others at
            the end): a run that fails before training leaves them as they were.
        eval_k (`int`, defaults to `4`): samples per held-out problem for the report (avg@k).
        eval_temperature (`float`, defaults to `1.0`): sampling temperature of the report's evaluation.
        report_eval_steps (`int`, *optional*): with `report`, also evaluate the held-out set every this many
            optimizer steps (logged as `eval/<task>/...` in `metrics.jsonl` and to `report_to`; the learning curve that
            `acpo-study --recipe` reads).
        low_memory (`bool`, defaults to `True`): on CPU, fix glibc's mmap threshold at 512 KB, so that freed tensors
            leave the process instead of staying resident (`acpo_trl/host_memory.py`): on the demo 3.38 GB peak
            instead of 3.60 GB, for ~15% more time. No effect off CPU or outside glibc.
        save_final_model (`bool`, defaults to `True`): save the trained model to `output_dir` at the end (with
            `save_strategy: "no"` and this off, a run writes no weights: a study cell).
        report_before_file (`str`, *optional*): with `report`, the before-training evaluation is read from this JSON
            file when it exists, and evaluated and written there when not. Runs that start from the same model and
            evaluate the same held-out set with the same seed share it (a study's variants of one seed).
    """

    task: str = field(default="countdown", metadata={"help": "countdown | math | hitab | addition | multiplication | toy"})
    prompt_template: str = field(default="base", metadata={"help": "'base' (no chat template) or 'chat'."})
    num_train_tasks: int = field(default=2048, metadata={"help": "Generated training tasks (countdown, addition)."})
    num_eval_tasks: int = field(default=64, metadata={"help": "Held-out problems for the before/after report."})
    countdown_min_numbers: int = field(default=3, metadata={"help": "Generated Countdown: fewest numbers."})
    countdown_max_numbers: int = field(default=4, metadata={"help": "Generated Countdown: most numbers."})
    countdown_format_score: float = field(default=0.0, metadata={"help": "Countdown format credit (TinyZero: 0.1)."})
    addition_digits: int = field(default=1, metadata={"help": "Addition / multiplication: digits per operand."})
    addition_shots: int = field(default=0, metadata={"help": "Addition / multiplication (chat): solved examples."})
    hitab_tables_dir: str | None = field(default=None, metadata={"help": "HiTab: folder of table JSON files."})
    eval_dataset_name: str | None = field(default=None, metadata={"help": "Held-out data file (hitab, countdown)."})
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Drop training prompts longer than this many tokens (the paper: 1024)."}
    )
    report: bool = field(default=False, metadata={"help": "Before/after evaluation, metrics JSONL, plot, report."})
    eval_k: int = field(default=4, metadata={"help": "Report: samples per held-out problem (avg@k)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Report: sampling temperature."})
    report_eval_steps: int | None = field(
        default=None, metadata={"help": "Report: also evaluate the held-out set every N optimizer steps."}
    )

    low_memory: bool = field(
        default=True, metadata={"help": "CPU: return freed tensors' memory to the OS (lower peak RSS, 1.15x the time)."}
    )
    save_final_model: bool = field(default=True, metadata={"help": "Save the trained model to output_dir at the end."})
    report_before_file: str | None = field(
        default=None, metadata={"help": "Report: read the before-training evaluation from / write it to this JSON file."}
    )

    def __post_init__(self):
        check_numbers(self, SCRIPT_RANGES)
        if self.task not in TASKS:
            raise ValueError(f"ACPOScriptArguments.task={self.task!r}: choose one of {sorted(TASKS)}.")
        if self.prompt_template not in ("base", "chat"):
            raise ValueError(f"ACPOScriptArguments.prompt_template={self.prompt_template!r}: use 'base' or 'chat'.")
        if self.report_eval_steps is not None and (self.report_eval_steps < 1 or not self.report):
            raise ValueError(f"ACPOScriptArguments.report_eval_steps={self.report_eval_steps}: give a positive "
                             "number of steps, together with `report: true` (the periodic evaluation is part of the "
                             "report).")
        if self.report_before_file is not None and not self.report:
            raise ValueError(f"ACPOScriptArguments.report_before_file={self.report_before_file!r}: the before-training "
                             "evaluation is part of the report; set `report: true` (or drop report_before_file).")


@dataclass
class Task:
    """What a training run needs from a task."""

    train_dataset: object  # datasets.Dataset with a `prompt` column and the reward's columns
    eval_dataset: object  # held-out problems, same columns
    reward_funcs: list[Callable]


def _countdown(args: ACPOScriptArguments, seed: int) -> Task:
    from .data.countdown import generate_countdown, load_countdown
    from .rewards.countdown import CountdownReward

    size = (args.countdown_min_numbers, args.countdown_max_numbers)

    def generated(n, offset):
        return generate_countdown(n, num_count=size, seed=seed + offset, template=args.prompt_template)

    train = (
        load_countdown(args.dataset_name, args.prompt_template, split=args.dataset_train_split)
        if args.dataset_name else generated(args.num_train_tasks, 0)
    )
    held_out = (
        load_countdown(args.eval_dataset_name, args.prompt_template, split=args.dataset_test_split)
        if args.eval_dataset_name else generated(args.num_eval_tasks, 10_000)  # a different seed: unseen tasks
    )
    return Task(train, held_out, [CountdownReward(format_score=args.countdown_format_score)])


def _math(args: ACPOScriptArguments, seed: int) -> Task:
    from .data.math import ORZ_HUB_ID, load_math_eval, load_orz
    from .rewards.math import math_reward

    train = load_orz(args.dataset_name or ORZ_HUB_ID, template=args.prompt_template, split=args.dataset_train_split)
    held_out = load_math_eval("math500", path=args.eval_dataset_name, template=args.prompt_template)
    return Task(train, held_out, [math_reward])


def _hitab(args: ACPOScriptArguments, seed: int) -> Task:
    from .data.hitab import load_hitab
    from .rewards.hitab import hitab_reward

    if not args.dataset_name or not args.hitab_tables_dir:
        raise ValueError(
            "task='hitab' needs `dataset_name` (HiTab samples jsonl or Hub id) and `hitab_tables_dir` (the folder "
            "of <table_id>.json files); `eval_dataset_name` gives the held-out samples."
        )
    train = load_hitab(args.dataset_name, args.hitab_tables_dir, template=args.prompt_template,
                       split=args.dataset_train_split)
    held_out = load_hitab(args.eval_dataset_name or args.dataset_name, args.hitab_tables_dir,
                          template=args.prompt_template, split=args.dataset_test_split)
    return Task(train, held_out, [hitab_reward])


# The arithmetic tasks: "What is a + b?" (addition) and "What is a * b?" (multiplication).
OPERATIONS = {"+": operator.add, "*": operator.mul}
OPERATION_NAMES = {"+": "additions", "*": "multiplications"}
# Solved examples for ``addition_shots``: they show the answer format in place of the instruction.
ADDITION_EXAMPLES = ((2, 3), (4, 4), (7, 1), (5, 8), (6, 2), (9, 7))


def arithmetic_instruction(op: str = "+") -> str:
    """The instruction of a problem without solved examples (2 op 2 = 4 for both operations)."""
    return f"Put your final answer within \\boxed{{}}, for example: 2 {op} 2 = \\boxed{{4}}."


ADDITION_INSTRUCTION = arithmetic_instruction("+")


def arithmetic_dataset(num_tasks: int, digits: int, seed: int, template: str, shots: int = 0, distinct: bool = False,
                       op: str = "+"):
    """``num_tasks`` problems "What is a op b?" (``op`` "+" or "*") with ``digits``-digit operands (seeded), answer
    in \\boxed{}; with ``distinct``, no problem twice (a held-out set: 100 single-digit problems are then all of
    them).

    With ``shots`` > 0 (chat template only) the question follows the first ``shots`` of ``ADDITION_EXAMPLES`` as
    earlier turns of the conversation (user "What is a op b?", assistant "\\boxed{a op b}") instead of the
    instruction: a small instruct model then answers in the format, in a few tokens."""
    from datasets import Dataset

    from .data.templates import build_prompt

    if shots and template != "chat":
        raise ValueError(f"ACPOScriptArguments.addition_shots={shots}: solved examples are earlier chat turns; set "
                         "prompt_template: chat (or addition_shots: 0).")
    if not 0 <= shots <= len(ADDITION_EXAMPLES):
        raise ValueError(f"ACPOScriptArguments.addition_shots={shots}: must be in [0, {len(ADDITION_EXAMPLES)}].")
    compute = OPERATIONS[op]
    history = []
    for a, b in ADDITION_EXAMPLES[:shots]:
        history += [{"role": "user", "content": f"What is {a} {op} {b}?"},
                    {"role": "assistant", "content": f"\\boxed{{{compute(a, b)}}}"}]
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    span = high - low + 1
    if distinct and num_tasks > span**2:
        raise ValueError(f"ACPOScriptArguments.num_eval_tasks={num_tasks}: there are only {span**2} distinct "
                         f"{digits}-digit {OPERATION_NAMES[op]}; ask for at most that many.")
    rng = random.Random(seed)
    pairs = ([divmod(i, span) for i in rng.sample(range(span**2), num_tasks)] if distinct else
             [(rng.randint(0, span - 1), rng.randint(0, span - 1)) for _ in range(num_tasks)])
    rows = {"prompt": [], "answer": []}
    for a, b in ((low + i, low + j) for i, j in pairs):
        if history:
            rows["prompt"].append(history + [{"role": "user", "content": f"What is {a} {op} {b}?"}])
        else:
            rows["prompt"].append(build_prompt(f"What is {a} {op} {b}?", arithmetic_instruction(op), template))
        rows["answer"].append(str(compute(a, b)))
    return Dataset.from_dict(rows)


def _arithmetic(op: str, args: ACPOScriptArguments, seed: int) -> Task:
    from .rewards.math import math_reward

    def build(n, offset, distinct=False):
        return arithmetic_dataset(n, args.addition_digits, seed + offset, args.prompt_template, args.addition_shots,
                                  distinct=distinct, op=op)

    return Task(build(args.num_train_tasks, 0), build(args.num_eval_tasks, 10_000, distinct=True), [math_reward])


def _toy(args: ACPOScriptArguments, seed: int) -> Task:
    from .toy import toy_dataset, toy_reward

    return Task(toy_dataset(args.num_train_tasks, seed), toy_dataset(args.num_eval_tasks, seed + 10_000), [toy_reward])


TASKS: dict[str, Callable[[ACPOScriptArguments, int], Task]] = {
    "countdown": _countdown,
    "math": _math,
    "hitab": _hitab,
    "addition": functools.partial(_arithmetic, "+"),
    "multiplication": functools.partial(_arithmetic, "*"),
    "toy": _toy,
}


def prompt_length(tokenizer, prompt) -> int:
    """Tokens of ``prompt`` as the trainer sees it (through the chat template when conversational)."""
    if isinstance(prompt, str):
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    encoded = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def drop_long_prompts(dataset, tokenizer, max_tokens: int):
    """``dataset`` without the rows whose prompt is longer than ``max_tokens`` tokens; logs how many went."""
    kept = dataset.filter(lambda row: prompt_length(tokenizer, row["prompt"]) <= max_tokens)
    if len(kept) < len(dataset):
        logger.warning("max_prompt_length=%d dropped %d of %d training prompts.", max_tokens,
                       len(dataset) - len(kept), len(dataset))
    if len(kept) == 0:
        raise ValueError(f"max_prompt_length={max_tokens} drops every training prompt; raise it.")
    return kept


def build_task(args: ACPOScriptArguments, seed: int = 0) -> Task:
    """The datasets and rewards of ``args.task``."""
    return TASKS[args.task](args, seed)
