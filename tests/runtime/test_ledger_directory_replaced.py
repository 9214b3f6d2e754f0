"""The ledger directory removed and made again under a ``LedgerDir`` (the controller's side): the
old directory's segments are let go of (closed, unmapped, logged once) and the new directory's
read afresh, a segment of the same name included.

Real engine processes attach through ``kvpolicy.attach`` to real segments on /dev/shm; what the
test process maps and holds open is read from /proc/self.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.values import GpuLimits, InstanceLimits
from kvpolicy.units import GiB
from tests.support.processes import read_line

ENGINE = textwrap.dedent("""
    import sys, kvpolicy
    inst = kvpolicy.attach(model="chat", gpu="cuda:0", ledger_dir=sys.argv[1], elastic=True, id="chat/0")
    print("attached", flush=True)
    sys.stdin.read()  # until the test closes it or kills this process
""")
FIGURES = GpuLimits(capacity=80 * GiB, headroom=2 * GiB, other_used=0, elastic_budget=78 * GiB)
REPLACED = "was removed and made again"


@pytest.fixture
def engine_processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def engine(ledger_dir: Path, started: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """A process holding the instance ``chat/0`` on ``cuda:0`` in ``ledger_dir``."""
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, str(ledger_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    started.append(proc)
    assert read_line(proc).strip() == "attached"
    return proc


def held_by_this_process(path: Path) -> list[str]:
    """What of a removed file ``path`` this process still maps or has open, as /proc/self names it."""
    gone = f"{path} (deleted)"
    maps = [line for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(gone)]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == gone:
                fds.append(f"fd {fd}")
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return maps + fds


def test_a_replaced_directory_is_let_go_of_and_its_successor_read_afresh(ledger_dir, engine_processes, caplog):
    caplog.set_level(logging.WARNING, logger="kvpolicy.ledger")
    first = engine(ledger_dir, engine_processes)
    ledger = LedgerDir(ledger_dir)
    try:
        before = ledger.read()
        assert before.find("chat/0").pid == first.pid
        segment = ledger_dir / "cuda:0.ledger"
        assert any(line.endswith(str(segment)) for line in Path("/proc/self/maps").read_text().splitlines())

        shutil.rmtree(ledger_dir)  # the first engine keeps its mapping of the removed segment, and runs on
        second = engine(ledger_dir, engine_processes)  # its attach makes the directory again, and a segment of the same name

        view = ledger.read()
        assert view.directory != before.directory
        assert [(v.id, v.pid) for v in view.instances()] == [("chat/0", second.pid)]
        assert held_by_this_process(segment) == [], "the removed segment is still mapped or open"
        stale = ledger.publish(before, 7, {"cuda:0": FIGURES}, {"chat/0": InstanceLimits(4 * GiB, 4 * GiB, 0)})
        assert stale == [f"{ledger_dir}: the ledger directory was removed or replaced since it was read; "
                         "nothing published"]
        assert ledger.publish(view, 8, {"cuda:0": FIGURES}, {"chat/0": InstanceLimits(48 * GiB, 40 * GiB, 4 * GiB)}) == []
        with LedgerDir(ledger_dir) as fresh:  # as the engine's next read finds it
            published = fresh.read().find("chat/0")
        assert (published.pid, published.limit, published.revision) == (second.pid, 48 * GiB, 8)
        ledger.read()
        ledger.heartbeat()
    finally:
        ledger.close()
    said = [r.getMessage() for r in caplog.records if REPLACED in r.getMessage()]
    assert len(said) == 1, said  # once, however often the new directory is read after
    assert said[0] == (f"the ledger directory {ledger_dir} {REPLACED}: closed the 1 segment(s) opened in the old one "
                       "(cuda:0) and reads the segments at that path afresh; engines still attached to the removed "
                       "segments are out of reach (restart them to join the new directory)")


def test_a_removed_directory_is_let_go_of_at_once(ledger_dir, engine_processes, caplog):
    caplog.set_level(logging.WARNING, logger="kvpolicy.ledger")
    engine(ledger_dir, engine_processes)
    with LedgerDir(ledger_dir) as ledger:
        assert len(ledger.read().instances()) == 1
        shutil.rmtree(ledger_dir)
        view = ledger.read()
        assert (view.directory, view.gpus, view.refused) == (None, {}, {})
        assert held_by_this_process(ledger_dir / "cuda:0.ledger") == []
        assert ledger.generations() == {}
    said = [r.getMessage() for r in caplog.records if "was removed" in r.getMessage()]
    assert len(said) == 1 and f"the ledger directory {ledger_dir} was removed: closed the 1 segment(s)" in said[0]
