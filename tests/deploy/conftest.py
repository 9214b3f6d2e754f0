"""Fixtures of the deployment tests: the repository, its release build, and the tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".hypothesis", ".whl", ".device")


def tool(name: str) -> str | None:
    """A command-line tool from this test environment (beside its python) or the PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Path:
    """``python -m build`` of a copy of the checkout: the sdist, and the wheel built from that sdist.

    Without build isolation (this environment's setuptools serves as the backend), so no index
    is asked; the backend and its configuration are the ones a release build uses.
    """
    root = tmp_path_factory.mktemp("release")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    out = root / "dist"
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out
