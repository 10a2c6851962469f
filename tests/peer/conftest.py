"""The peer suite's setup: TRL's own conftest fixtures, the offline Hub, and which upstream tests run or xfail.

See docs/peer_suite.md. Everything here is scoped to tests/peer: the Hub cache and offline mode are set for this
package's tests only and restored after them.
"""

from __future__ import annotations

import pytest

from .expectations import EXPECTED_FAILURES
from .offline_hub import build_offline_hub
from .upstream import PACKAGE, PEER_DIR, TESTS_DIR, missing_repos, use_local_zen

if TESTS_DIR.is_dir():
    from .upstream import upstream_conftest, upstream_test_module

    # TRL's conftest, as its tests expect it: CPU-only configs, cleanup after each test, frames freed on failure.
    _trl_conftest = upstream_conftest()
    force_use_cpu_without_accelerator = _trl_conftest.force_use_cpu_without_accelerator
    apply_model_revisions = _trl_conftest.apply_model_revisions
    cleanup_gpu = _trl_conftest.cleanup_gpu
    cleanup_vllm_dist_env = _trl_conftest.cleanup_vllm_dist_env
    pytest_runtest_makereport = _trl_conftest.pytest_runtest_makereport


@pytest.fixture(scope="package", autouse=True)
def offline_hub(tmp_path_factory):
    """Build the tiny models and the zen dataset once; point the Hub cache and the tests' ``load_dataset`` at them.

    Only instantiated when a test here runs, and the test modules skip themselves when the peer suite is absent."""
    import huggingface_hub.constants

    root = tmp_path_factory.mktemp("peer_hub")
    hub_cache, zen_dir = build_offline_hub(root, PEER_DIR)
    use_local_zen(upstream_test_module(), zen_dir, root / "datasets")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}.items():
            mp.setenv(name, value)  # for anything that reads the environment (subprocesses, late imports)
        # huggingface_hub read both at import; its download functions look them up on `constants` at call time.
        mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield hub_cache


@pytest.fixture(autouse=True)
def restore_start_method():
    """Undo ``torch.multiprocessing.set_start_method("spawn", force=True)`` (test_train_multiple_dataloader_workers),
    which would otherwise hold for every later test of the session, the main suite's included."""
    import multiprocessing

    method = multiprocessing.get_start_method(allow_none=True)
    yield
    if multiprocessing.get_start_method(allow_none=True) != method:
        multiprocessing.set_start_method(method, force=True)


def _upstream_id(item: pytest.Function) -> str:
    """``Class::test[params]``: the test's id within the upstream module (the same under both trainers)."""
    return item.nodeid.split("::", 1)[1]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Skip upstream tests that need repositories the offline hub does not build; mark the expected failures."""
    xfails = EXPECTED_FAILURES
    for item in items:
        if not getattr(item, "function", None) or not item.function.__module__.startswith(PACKAGE):
            continue  # not an upstream test
        missing = missing_repos(item)
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)} (not built offline)"))
        elif _upstream_id(item) in xfails:
            raises, reason = xfails[_upstream_id(item)]
            item.add_marker(pytest.mark.xfail(strict=True, raises=raises, reason=reason))
