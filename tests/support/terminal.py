"""Running ``kvpolicy`` with its output on a terminal (a pseudo-terminal): colour, ``top``."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Screen:
    returncode: int
    text: str
    """Everything the command wrote to the terminal (its standard output and error)."""


def in_a_terminal(*args: str, env: Mapping[str, str] | None = None, columns: int | None = None,
                  timeout: float = 120.0) -> Screen:
    """What ``kvpolicy ARGS`` writes to a terminal (of ``columns`` columns, when given), run to
    its end with ``env`` over this environment less ``NO_COLOR`` and ``FORCE_COLOR``, ``TERM=xterm``
    and no standard input."""
    leader, follower = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    environ["TERM"] = "xterm"
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    process = subprocess.Popen([sys.executable, "-m", "kvpolicy.cli", *args], stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=follower, env={**environ, **(env or {})})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    returncode = process.wait(timeout=timeout)
    os.close(leader)
    return Screen(returncode, b"".join(chunks).decode())
