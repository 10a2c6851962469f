"""TRL's own GRPO tests (../shared/peer/trl/tests/test_grpo_trainer.py, unmodified) on ACPOTrainer.

The upstream test classes are collected here, with ``GRPOTrainer`` / ``GRPOConfig`` bound to ``ACPOTrainer`` and
``ACPOConfig(policy_loss="ppo_clip", dual_clip_c=None)`` (``ACPO_PEER_TRAINER=grpo``: TRL's own classes). Which
tests run, skip or xfail is decided in conftest.py and expectations.py; see docs/peer_suite.md.
"""

import pytest

from .upstream import ABSENT, TESTS_DIR

if not TESTS_DIR.is_dir():
    pytest.skip(ABSENT, allow_module_level=True)

from .upstream import upstream_test_module  # noqa: E402  # noqa: E402

# pytest collects the test classes found in this module's namespace.
for _name, _obj in vars(upstream_test_module()).items():
    if _name.startswith("Test") and isinstance(_obj, type):
        globals()[_name] = _obj
