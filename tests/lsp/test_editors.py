"""Real editors as clients, where one is installed (skipped elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_check(command: list[str]) -> str:
    """Run an editor's headless check against this environment's ``kvpolicy``; its report."""
    kvpolicy = Path(sys.executable).with_name("kvpolicy")
    done = subprocess.run(
        command, cwd=ROOT, env=dict(os.environ, KVPOLICY=str(kvpolicy)), capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL,
    )
    report = (done.stdout + done.stderr).replace("\r", "\n")
    assert done.returncode == 0, report
    return report


def passed_steps(report: str) -> int:
    lines = report.splitlines()
    assert not any(line.startswith("FAIL") for line in lines), report
    return sum(line.startswith("ok   ") for line in lines)


@pytest.mark.skipif(shutil.which("nvim") is None, reason="Neovim is not installed")
def test_neovim_headless_session() -> None:
    """editors/neovim/headless-check.lua: diagnostics, hover, completion, a fix, formatting."""
    report = run_check(["nvim", "--headless", "-n", "-u", "NONE", "-c", "luafile editors/neovim/headless-check.lua"])
    assert passed_steps(report) == 6, report


def _has_eglot() -> bool:
    if shutil.which("emacs") is None:
        return False
    probe = subprocess.run(
        ["emacs", "--batch", "-Q", "--eval",
         '(progn (dolist (d (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*")) (add-to-list (quote load-path) d))'
         " (kill-emacs (if (require (quote eglot) nil t) 0 1)))"],
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _has_eglot(), reason="Emacs with eglot is not installed")
def test_emacs_eglot_headless_session() -> None:
    """editors/emacs/headless-check.el: diagnostics, hover, a fix, formatting."""
    report = run_check(["emacs", "--batch", "-Q", "-l", "editors/emacs/headless-check.el"])
    assert passed_steps(report) == 6, report
