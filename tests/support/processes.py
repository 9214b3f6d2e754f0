"""Reading what a test's subprocess printed."""

from __future__ import annotations

import json
import subprocess


def last_json(result: subprocess.CompletedProcess) -> dict:
    """The last line of ``result.stdout`` that is a JSON object; fails with both streams' tails if there is none."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON from the subprocess:\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-6000:]}"
    return json.loads(lines[-1])
