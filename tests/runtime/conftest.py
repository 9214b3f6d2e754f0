"""Fixtures for the ledger tests: a fresh ledger directory on tmpfs, and helpers to audit it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger_dir() -> Path:
    """A ledger directory that does not exist yet (on /dev/shm when there is one, as in production)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    parent = base / f"kvpolicy-test-{uuid.uuid4().hex[:12]}"
    parent.mkdir(mode=0o700)
    try:
        yield parent / "ledger"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for python subprocesses that must import this checkout of kvpolicy."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
