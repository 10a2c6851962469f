"""acpo_trl: ACPO (bin-wise adaptive clipping) and its baselines as a TRL ``GRPOTrainer`` subclass.

``ACPOConfig`` and ``ACPOTrainer`` are imported lazily so that light users (rewards, data loaders,
losses) do not pay TRL's import time.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "ACPOConfig": "acpo_trl.config",
    "ACPOTrainer": "acpo_trl.trainer",
}

__all__ = ["ACPOConfig", "ACPOTrainer", "__version__"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'acpo_trl' has no attribute {name!r}")
