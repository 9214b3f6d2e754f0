"""Reading what a test's subprocess printed."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest


def last_json(result: subprocess.CompletedProcess) -> dict:
    """The last line of ``result.stdout`` that is a JSON object; fails with both streams' tails if there is none."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON from the subprocess:\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-6000:]}"
    return json.loads(lines[-1])


HANG = 120.0
"""Seconds to wait for a subprocess's next line: only to catch a hang, never a speed goal."""


def read_line(proc: subprocess.Popen, timeout: float = HANG) -> str:
    """The next line ``proc`` prints on its stdout (a pipe); fails, killing it, if none comes in ``timeout``."""
    assert proc.stdout is not None, "the process's stdout is not a pipe"
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.kill()  # its pipe closes: the reader's readline returns
        reader.join()
        pytest.fail(f"pid {proc.pid} printed no line in {timeout:.0f} s (hung?)")
    return got[0]
