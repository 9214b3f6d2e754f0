"""An AdapterError that ends an engine's process prints as its message alone; anything else as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import sys
from kvpolicy.adapters.errors import AdapterError, report_briefly
report_briefly()
report_briefly()  # a second call installs nothing more
def start_engine():
    raise {error}
start_engine()
"""


def run(error: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(error=error)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_an_adapter_error_prints_its_message_without_the_traceback() -> None:
    done = run('AdapterError("kvpolicy ledger: cannot admit 96 MiB on cpu:0. Lower the model\'s reserve.")')
    assert done.returncode == 1
    assert done.stderr == (
        "kvpolicy.adapters.errors.AdapterError: kvpolicy ledger: cannot admit 96 MiB on cpu:0. "
        "Lower the model's reserve.\n"
    )


@pytest.mark.parametrize("error", ['ValueError("not ours")', 'RuntimeError("nor this")'])
def test_other_errors_keep_their_traceback(error: str) -> None:
    done = run(error)
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert "in start_engine" in done.stderr
    assert done.stderr.endswith(f"{error.split('(')[0]}: {error.split(chr(34))[1]}\n")
