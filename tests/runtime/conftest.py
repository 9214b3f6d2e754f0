"""Fixtures for the ledger tests (the fresh ledger directory, ``ledger_dir``, is tests/conftest.py's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for python subprocesses that must import this checkout of kvpolicy."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
