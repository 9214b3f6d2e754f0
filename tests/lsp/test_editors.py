"""Real editors as clients, where one is installed (skipped elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("nvim") is None, reason="Neovim is not installed")
def test_neovim_headless_session() -> None:
    """editors/neovim/headless-check.lua: diagnostics, hover, completion, a fix, formatting."""
    kvpolicy = Path(sys.executable).with_name("kvpolicy")
    done = subprocess.run(
        ["nvim", "--headless", "-n", "-u", "NONE", "-c", "luafile editors/neovim/headless-check.lua"],
        cwd=ROOT, env=dict(os.environ, KVPOLICY=str(kvpolicy)), capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )
    report = (done.stdout + done.stderr).replace("\r", "\n")
    assert done.returncode == 0, report
    assert report.count("ok   ") == 6 and "FAIL" not in report, report
