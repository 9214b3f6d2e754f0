"""Fixtures for the SGLang DeepSeek-V4 tests: the real sglang 0.5.23 classes, on CPU.

Tests marked ``sglang`` need the wheel (requirements/sglang-cpu.txt); without it
they are skipped with the reason (tests/conftest.py). Import-only stand-ins (``sglang_standins.py``) cover
the packages SGLang imports but never runs while building pools.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from tests.sglang import sglang_standins
from tests.sglang.sglang_support import published_server_args, single_process_parallel


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
    with ExitStack() as stack:
        stack.enter_context(single_process_parallel())
        yield lambda **fields: stack.enter_context(published_server_args(**fields))
