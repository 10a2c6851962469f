"""TRL's own GRPO test module (../shared/peer, upstream and unmodified), imported and pointed at the trainer under test.

The upstream files are imported as the package ``trl_peer_tests`` (their directory has no ``__init__.py``; the test
module imports ``.testing_utils`` relatively), with pytest's assertion rewriting. Nothing in them is edited: the
trainer, its config and ``load_dataset`` are rebound in the imported module's namespace, which is where the tests
look them up when they run.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
import types
from pathlib import Path

import pytest

from .offline_hub import BUILT_REPOS, ZEN_ID

PACKAGE = "trl_peer_tests"
#: Where the peer suite lives: ``$ACPO_PEER_DIR``, else ``../shared/peer`` beside the repository (its README says
#: where the files come from).
PEER_DIR = Path(os.environ.get("ACPO_PEER_DIR") or Path(__file__).resolve().parents[3] / "shared" / "peer")
TESTS_DIR = PEER_DIR / "trl" / "tests"
ABSENT = f"TRL's GRPO tests not found at {PEER_DIR} (set ACPO_PEER_DIR to a folder holding trl/tests and trl/scripts)"

#: ``ACPO_PEER_TRAINER``: "acpo" (default) runs the tests on ACPOTrainer, "grpo" on TRL's GRPOTrainer itself.
TRAINERS = ("acpo", "grpo")

#: The registry method the tests run where they ask for TRL's clipped objective: TRL's fixed clip, without this
#: package's dual-clip, computed by ACPOTrainer's own loss path (so TRL's options are exercised through it).
ACPO_PEER_CONFIG = {"policy_loss": "ppo_clip", "dual_clip_c": None}


def acpo_peer_config(*args, **kwargs):
    """What a TRL user writes to switch to ``ACPOConfig``: TRL's fixed clip as a registry method
    (:data:`ACPO_PEER_CONFIG`), or ``policy_loss="trl"`` where the test asks for one of TRL's own objectives
    (``loss_type`` cispo / sapo / vespo, GSPO's sequence-level importance sampling), which no registry method is."""
    from acpo_trl import ACPOConfig
    from acpo_trl.config import TRL_LOSS, TRL_OBJECTIVES

    trl_objective = kwargs.get("loss_type") in TRL_OBJECTIVES or kwargs.get("importance_sampling_level") == "sequence"
    return ACPOConfig(*args, **kwargs, **({"policy_loss": TRL_LOSS} if trl_objective else ACPO_PEER_CONFIG))

#: Hub organisations the upstream file names repositories of (other "a/b" strings in it are metric names).
_HUB_ORGS = ("trl-internal-testing", "Qwen", "HuggingFaceTB", "kernels-community")
_HUB_ID = re.compile(rf"^(?:{'|'.join(_HUB_ORGS)})/[\w.-]+$")


def peer_trainer_name() -> str:
    name = os.environ.get("ACPO_PEER_TRAINER", "acpo")
    if name not in TRAINERS:
        raise pytest.UsageError(f"ACPO_PEER_TRAINER={name!r}: must be one of {TRAINERS}.")
    return name


def _shim_trl() -> None:
    """The tests' ``testing_utils`` imports ``trl.import_utils.is_joblib_available``, which TRL dropped after 1.10."""
    import_utils = importlib.import_module("trl.import_utils")
    if not hasattr(import_utils, "is_joblib_available"):
        import_utils.is_joblib_available = functools.partial(import_utils._is_package_available, "joblib")


def _import(name: str) -> types.ModuleType:
    if PACKAGE not in sys.modules:
        _shim_trl()
        pytest.register_assert_rewrite(PACKAGE)
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(TESTS_DIR)]
        sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.{name}")


def upstream_conftest() -> types.ModuleType:
    return _import("conftest")


def upstream_test_module() -> types.ModuleType:
    """``test_grpo_trainer``, its ``GRPOTrainer`` / ``GRPOConfig`` bound to the trainer ``ACPO_PEER_TRAINER`` names."""
    module = _import("test_grpo_trainer")
    if peer_trainer_name() == "acpo":
        from acpo_trl import ACPOTrainer

        module.GRPOTrainer = ACPOTrainer
        module.GRPOConfig = acpo_peer_config
    return module


def use_local_zen(module: types.ModuleType, zen_dir: Path, datasets_cache: Path) -> None:
    """Bind the module's ``load_dataset`` to one that reads ``trl-internal-testing/zen`` from ``zen_dir``."""
    import datasets

    def load_dataset(path, *args, **kwargs):
        if path == ZEN_ID:
            path = str(zen_dir)
            kwargs.setdefault("cache_dir", str(datasets_cache))
        return datasets.load_dataset(path, *args, **kwargs)

    module.load_dataset = load_dataset


def hub_repos_named(item: pytest.Function) -> set[str]:
    """The Hub repositories a test names: in its body (not its decorators) and in its parameters."""
    lines, _ = inspect.getsourcelines(item.function)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def ")))
    body = "".join(lines[start:])
    named = {s for s in re.findall(r"[\"']([^\"'\s]+/[^\"'\s]+)[\"']", body) if _HUB_ID.match(s)}
    params = getattr(item, "callspec", None)
    if params is not None:
        named |= {v for v in params.params.values() if isinstance(v, str) and _HUB_ID.match(v)}
    return named


def missing_repos(item: pytest.Function) -> list[str]:
    """The Hub repositories a test needs that the offline hub does not build."""
    return sorted(hub_repos_named(item) - set(BUILT_REPOS))
