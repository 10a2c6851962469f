"""Tasks by name, each one module that registers what a run needs from it (:mod:`.registry`): its training set,
held-out set, prompt template (``prompt_template``), reward, its own ``acpo-train`` fields and its ``acpo-eval``
benchmarks. Importing this package registers the built-in tasks:

    addition, multiplication   generated "What is a op b?" problems (arithmetic.py)
    running_sum                "What is n1 + ... + nm?" answered step by step (running_sum.py)
    countdown                  TinyZero's Countdown (countdown.py)
    math                       ORZ-57K, MATH500 and five more benchmarks (math.py)
    hitab                      HiTab table QA (hitab.py)
    toy                        the tiny local model's letter task (toy.py)
    add1, add2                 the CPU testbed's additions (testbed.py)

A new task is one module with one ``register_task`` call (``tests/test_tasks.py`` registers one from a test file
and trains and evaluates it through the command lines).
"""

from .registry import (BenchmarkSource, Task, TaskArguments, TaskSpec, benchmark_loader, benchmark_names, build_task,
                       get_task, options_classes, register_task, registered, with_task_options)
from . import arithmetic, countdown, hitab, math, running_sum, testbed, toy  # noqa: E402,F401  (registration order: help texts)

__all__ = ["BenchmarkSource", "Task", "TaskArguments", "TaskSpec", "benchmark_loader", "benchmark_names", "build_task",
           "get_task", "options_classes", "register_task", "registered", "with_task_options"]
