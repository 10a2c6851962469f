"""The task registry: one registration per task says everything a run needs from it (as a policy loss is one
entry of ``acpo_trl.losses.POLICY_LOSSES``)::

    register_task(TaskSpec(
        name="addition",
        build=build_addition,        # (args, seed) -> Task: training set, held-out set, reward functions
        options=ArithmeticOptions,   # the task's own acpo-train fields (a dataclass), or None
        benchmarks={...},            # acpo-eval's sets: name -> loader(BenchmarkSource) -> (dataset, reward)
    ))

``build`` reads its ``args`` from one object: :class:`TaskArguments` (the task, its prompt template and sizes,
TRL's dataset fields) with every registered task's options as fields too (:func:`with_task_options`);
``acpo-train``'s script arguments extend it. ``acpo-train`` builds the task named by ``task``, reports on its
held-out set and names the model card after it; ``acpo-eval`` and ``acpo-dlogp`` evaluate any task's benchmarks, and
a task without declared benchmarks is one itself: its held-out set with the default options (``acpo-eval
--benchmarks addition``); ``acpo-study`` runs recipes of any task. A task of another package registers on import:
import it before calling ``acpo_trl.train.main`` (a three-line script), or declare it under the ``acpo_trl.tasks``
entry-point group (``module:object``, loaded when the registry is first read).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from trl import ScriptArguments

from ..utils.number_checks import AT_LEAST_ONE, check_numbers

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "acpo_trl.tasks"
TEMPLATES = ("base", "chat")
TASK_RANGES = {"num_train_tasks": AT_LEAST_ONE, "num_eval_tasks": AT_LEAST_ONE}  # checked at construction


@dataclass
class TaskArguments(ScriptArguments):
    """What a task's ``build`` reads besides its own options: TRL's ``ScriptArguments`` (``dataset_name``, splits)
    and the fields below. ``acpo-train``'s ``ACPOScriptArguments`` extends it.

    Parameters:
        task (`str`, defaults to `"countdown"`): a registered task (`acpo_trl.tasks`): `addition`, `multiplication`,
            `running_sum`, `countdown`, `math`, `hitab`, `toy`, `add1`, `add2`, or one of yours. Its own fields (e.g.
            `arithmetic_digits`, `countdown_min_numbers`, `hitab_tables_dir`) are documented with its options class.
        prompt_template (`str`, defaults to `"base"`): `"base"` (ACPO's template, no chat template) or `"chat"`.
        num_train_tasks (`int`, defaults to `2048`): generated tasks (countdown without `dataset_name`, addition).
        num_eval_tasks (`int`, defaults to `64`): held-out problems for the before/after report.
        eval_dataset_name (`str`, *optional*): held-out data (HiTab samples, or a Countdown file).
    """

    task: str = field(default="countdown", metadata={"help": "A registered task (acpo_trl.tasks), e.g. addition."})
    prompt_template: str = field(default="base", metadata={"help": "'base' (no chat template) or 'chat'."})
    num_train_tasks: int = field(default=2048, metadata={"help": "Generated training tasks (countdown, addition)."})
    num_eval_tasks: int = field(default=64, metadata={"help": "Held-out problems for the before/after report."})
    eval_dataset_name: str | None = field(default=None, metadata={"help": "Held-out data file (hitab, countdown)."})

    def __post_init__(self):
        check_numbers(self, TASK_RANGES)
        get_task(self.task)  # a ValueError naming the registered tasks
        if self.prompt_template not in TEMPLATES:
            raise ValueError(f"ACPOScriptArguments.prompt_template={self.prompt_template!r}: use 'base' or 'chat'.")


@dataclass
class Task:
    """What a training run needs from a task: datasets with a ``prompt`` column and the reward's columns, and TRL
    reward functions (``prompts, completions, **columns -> list[float | None]``)."""

    train_dataset: Any
    eval_dataset: Any
    reward_funcs: list[Callable]


@dataclass(frozen=True)
class BenchmarkSource:
    """Where ``acpo-eval`` reads a benchmark from: ``path`` (from ``NAME=PATH``), ``data_dir`` (a folder laid out
    like the project's offline data), the prompt ``template``, HiTab's ``hitab_tables_dir``, and ``recipe``: the
    ``(script_args, seed)`` of an ``acpo-train`` recipe, whose task's generated held-out set is the recipe's own
    (its task fields, ``num_train_tasks``, ``num_eval_tasks``, seed and template), as its run's report evaluates it."""

    path: str | None = None
    data_dir: str | None = None
    template: str = "base"
    hitab_tables_dir: str | None = None
    recipe: tuple | None = None


BenchmarkLoader = Callable[[BenchmarkSource], tuple[Any, Callable]]


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: its ``name`` (``task:`` in a recipe), ``build(args, seed) -> Task``, the dataclass of its
    own ``acpo-train`` fields (``options``; their names must be unique across tasks, e.g. prefixed with the task's
    name), its ``acpo-eval`` benchmarks (none: the task's held-out set is one, under the task's name), a
    one-line ``summary`` for help texts, and, for a task with worked answers, ``worked_solutions(args, num_examples,
    seed, exclude_seeds)``: prompt-completion rows for a supervised warm-up (``acpo-warmup``) that avoid the held-out
    problems of run seeds ``0..exclude_seeds - 1``."""

    name: str
    build: Callable[[Any, int], Task]
    options: type | None = None
    benchmarks: Mapping[str, BenchmarkLoader] = field(default_factory=dict)
    summary: str = ""
    worked_solutions: Callable[[Any, int, int, int], Any] | None = None


TASKS: dict[str, TaskSpec] = {}
_entry_points_loaded = False


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` to :data:`TASKS`; refuses a name, benchmark or option field another task holds."""
    if spec.name in TASKS and TASKS[spec.name] is not spec:
        raise ValueError(f"task {spec.name!r} is registered already ({TASKS[spec.name].summary}); choose another name.")
    if spec.options is not None and not dataclasses.is_dataclass(spec.options):
        raise TypeError(f"task {spec.name!r}: options must be a dataclass of the task's fields, got {spec.options!r}.")
    for other in TASKS.values():
        if other is spec:
            continue
        shared = set(_benchmark_names(other)) & set(_benchmark_names(spec))
        if shared:
            raise ValueError(f"task {spec.name!r}: benchmark(s) {sorted(shared)} belong to task {other.name!r}.")
        if spec.options is not None and other.options is not None and other.options is not spec.options:
            clash = {f.name for f in dataclasses.fields(spec.options)} & {f.name for f in dataclasses.fields(other.options)}
            if clash:
                raise ValueError(f"task {spec.name!r}: option field(s) {sorted(clash)} are task {other.name!r}'s; "
                                 "prefix the fields with the task's name.")
    TASKS[spec.name] = spec
    return spec


def _benchmark_names(spec: TaskSpec) -> Sequence[str]:
    return tuple(spec.benchmarks) or (spec.name,)


def registered() -> dict[str, TaskSpec]:
    """:data:`TASKS`, after loading the tasks other packages declare under the ``acpo_trl.tasks`` entry points."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                point.load()
            except Exception as error:  # a broken plugin must not break the built-in tasks
                logger.warning("Task entry point %s (%s) failed to load: %s", point.name, point.value, error)
    return TASKS


def get_task(name: str) -> TaskSpec:
    """The registered task ``name``; a ValueError naming the registered ones otherwise."""
    tasks = registered()
    if name not in tasks:
        raise ValueError(f"ACPOScriptArguments.task={name!r}: no such task; choose one of {sorted(tasks)} (or "
                         "register yours: acpo_trl.tasks.register_task).")
    return tasks[name]


def options_classes() -> list[type]:
    """The registered tasks' option dataclasses, each once, in registration order (``acpo-train``'s parser)."""
    return list(dict.fromkeys(spec.options for spec in registered().values() if spec.options is not None))


def with_task_options(base: type) -> type:
    """``base`` (:class:`TaskArguments` or a subclass) with every registered task's options as fields too: the one
    object a task's builder reads its fields from. A field of another task than ``task`` set to a value other than
    its default is ignored, with a warning."""
    return _with_options(base, tuple(options_classes()))


@functools.cache
def _with_options(base: type, options: tuple[type, ...]) -> type:
    def __post_init__(self):
        base.__post_init__(self)
        own = get_task(self.task).options
        for cls in options:
            if hasattr(cls, "__post_init__"):
                cls.__post_init__(self)
            if cls is not own:
                default = cls()
                unused = [f.name for f in dataclasses.fields(cls) if getattr(self, f.name) != getattr(default, f.name)]
                if unused:
                    logger.warning("%s: field(s) of another task, ignored by task %r.", ", ".join(unused), self.task)

    return dataclasses.make_dataclass(base.__name__, [], bases=(base, *options),
                                      namespace={"__post_init__": __post_init__, "__doc__": base.__doc__})


def build_task(args, seed: int = 0) -> Task:
    """The datasets and rewards of the task ``args.task`` (``args``: ``with_task_options(TaskArguments)`` or
    ``acpo-train``'s script arguments)."""
    return get_task(args.task).build(args, seed)


def benchmark_names() -> list[str]:
    """Every benchmark ``acpo-eval`` knows, in registration order."""
    return [name for spec in registered().values() for name in _benchmark_names(spec)]


def benchmark_loader(name: str) -> BenchmarkLoader:
    """The loader of benchmark ``name``: a task's declared benchmark, or a task's held-out set built with the
    default options (no file: a generated set)."""
    for spec in registered().values():
        if name in spec.benchmarks:
            return spec.benchmarks[name]
        if not spec.benchmarks and name == spec.name:
            return lambda source, spec=spec: _held_out(spec, source)
    raise ValueError(f"unknown benchmark {name!r}: use one of {benchmark_names()}, optionally as NAME=PATH.")


def _held_out(spec: TaskSpec, source: BenchmarkSource):
    if source.path is not None:
        raise ValueError(f"benchmark {spec.name!r} is generated by its task, not read from a file: drop `={source.path}`.")
    if source.recipe is not None and source.recipe[0].task == spec.name:
        task = spec.build(*source.recipe)
    else:
        task = spec.build(with_task_options(TaskArguments)(task=spec.name, prompt_template=source.template), 0)
    return task.eval_dataset, task.reward_funcs[0]
