"""Fixtures for the SGLang DeepSeek-V4 tests: the real sglang 0.5.23 classes, on CPU.

Tests marked ``sglang`` need the wheel (requirements/sglang-cpu.txt); without it
they are skipped with the reason. Import-only stand-ins (``sglang_standins.py``) cover
the packages SGLang imports but never runs while building pools.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

import sglang_standins

from sglang_support import SGLANG_MISSING, SKIP_REASON


def pytest_collection_modifyitems(config, items):
    if not SGLANG_MISSING:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("sglang") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sglang_env():
    """Import sglang once (with stand-ins for what it cannot import here)."""
    sglang_standins.install()
    import sglang.srt.mem_cache.kv_cache_configurator  # noqa: F401  (the heavy import, once)
    from sglang.version import __version__

    assert __version__ == "0.5.23", f"tests pin sglang 0.5.23, found {__version__}"
    return __version__


@pytest.fixture
def server_args(sglang_env):
    """Publish SGLang server args for one test (and restore the previous context after)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.runtime_context import get_context, get_parallel

    overrides = []

    def publish(**fields):
        fields.setdefault("page_size", 256)
        fields.setdefault("kv_cache_dtype", "fp8_e4m3")
        fields.setdefault("device", "cpu")
        fields.setdefault("mem_fraction_static", 0.9)
        fields.setdefault("cuda_graph_config", CudaGraphConfig(
            decode=PhaseConfig(backend=Backend.DISABLED), prefill=PhaseConfig(backend=Backend.DISABLED)))
        ov = get_context().override_server_args(**fields)
        args = ov.install()
        overrides.append(ov)
        return args

    parallel = get_parallel().override(world_group=NS(cpu_group=None))
    parallel.__enter__()
    yield publish
    parallel.__exit__(None, None, None)
    for ov in reversed(overrides):
        ov.restore()


