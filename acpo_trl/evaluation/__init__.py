"""Evaluation: avg@k / pass@k of a model on the project's benchmarks (``acpo-eval``), and an in-training callback.

- ``metrics`` and ``report``: pure Python (no torch), reusable by analysis tools.
- ``benchmarks``: benchmark name -> data loader and reward.
- ``generation``: vLLM and transformers backends.
- ``runner``: ``evaluate(EvalConfig)``, resumable, writes ``results.json`` / ``results.md``.
- ``callback``: ``EvalCallback`` for ``GRPOTrainer`` and subclasses.

Heavy pieces are imported lazily, so ``from acpo_trl.evaluation import pass_at_k`` stays light.
"""

import importlib

from .metrics import avg_at_k, macro_average, pass_at_k, summarize
from .report import markdown_table

_LAZY = {
    "EvalConfig": "acpo_trl.evaluation.config",
    "evaluate": "acpo_trl.evaluation.runner",
    "load_benchmark": "acpo_trl.evaluation.benchmarks",
    "Benchmark": "acpo_trl.evaluation.benchmarks",
    "TransformersBackend": "acpo_trl.evaluation.generation",
    "VLLMBackend": "acpo_trl.evaluation.generation",
    "EvalCallback": "acpo_trl.evaluation.callback",
}

__all__ = ["avg_at_k", "macro_average", "markdown_table", "pass_at_k", "summarize", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'acpo_trl.evaluation' has no attribute {name!r}")
