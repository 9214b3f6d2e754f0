"""Torture: 1,000 mixed hot-reload edits against a real ``kvpolicy run`` process.

The controller runs as a subprocess on a temporary ledger directory with
``--gpu-capacity``; a second process holds two attached instances, so every
policy publishes a limit the test reads from the ledger. The edits mix in-place
writes, slow in-place saves (a pause between two writes), atomic renames, editor
backups, ConfigMap ``..data`` swaps, a symlink into another directory (edited
there, or re-pointed), delete and recreate, an unreadable file and a directory in
the policy's place; the content is valid, invalid, a truncated prefix, or not
UTF-8. After each edit the test waits (with a hang bound only) for the
controller's log to name the edit: its content loaded or rejected, or the file
missing. Throughout: the limit in the ledger is the last valid policy's, and no
content the controller ever loaded was invalid or a prefix of a slow save.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

from kvpolicy.lint.engine import lint_bytes
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.status import read_status
from tests.fuzz.scale import HANG_SECONDS, RELOAD_EDITS, scaled, seed
from tests.support.policy_saves import Directory, sha
from tests.support.waiting import wait_for
from tests.support.processes import read_line

pytestmark = pytest.mark.fuzz

GiB = 1 << 30
CAPACITY_GIB = 80
QUIET = 5.0
"""The controller's quiet period here: far above the slow saves' 15-40 ms pause (every edit below
ends in a close-write or rename, so none should wait for it). An in-place save that a loaded
machine stalled this long may have its valid first half go live, the watcher's documented limit:
the writer measures how long the half stood in the file, and only then is that excused."""

ENGINES = textwrap.dedent("""
    import sys, time, kvpolicy
    ledger = sys.argv[1]
    engine = kvpolicy.attach(model="engine", gpu="cuda:0", ledger_dir=ledger, elastic=True, id="engine/0")
    other = kvpolicy.attach(model="other", gpu="cuda:0", ledger_dir=ledger, elastic=True, id="other/0")
    print("attached", flush=True)
    sys.stdin.readline()
""")

LOADED = re.compile(r"kvpolicy\.watch INFO policy .* revision \d+ loaded \(sha256 (?P<sha>[0-9a-f]{64}), (?P<how>[a-z-]+)\)")
REJECTED = re.compile(r"kvpolicy\.watch WARNING policy .* rejected \(sha256 (?P<sha>[0-9a-f]{64}), ")
MISSING = re.compile(r"kvpolicy\.watch WARNING policy .*: (the policy|cannot read)")

INVALID = [
    b"",
    b'version 1\nmodel "x" { reserve 4 GiBB }\n',
    b'version 1\nmodel "x" {\n  priority\n',
    b'model "x" { priority 1 }\n',
    b"version 2\n",
    b'version 1\nrule "r" { when gpu.fre < 1 GiB; shrink to min; grace 1s }\n',
    b"version 1\n\xff\xfe not utf-8\n",
]


def valid_policy(n: int, other_gib: int) -> bytes:
    return (
        f"# edit {n}\nversion 1\n"
        'model "engine" { priority 100; min 1 GiB; max 100% }\n'
        f'model "other" {{ priority 10; min {other_gib} GiB }}\n'
        'rule "idle" {\n  when model.idle > 600s\n  shrink to min\n  grace 30s\n}\n'
    ).encode()


def engine_limit(other_gib: int) -> int:
    return (CAPACITY_GIB - other_gib) * GiB


class ControllerLog:
    """The controller's stderr, read on a thread: what it loaded, rejected and found missing."""

    def __init__(self, stream) -> None:
        self.events: list[tuple[str, str | None, str]] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            event = None
            if m := LOADED.search(line):
                event = ("loaded", m["sha"], m["how"])
            elif m := REJECTED.search(line):
                event = ("rejected", m["sha"], "")
            elif MISSING.search(line):
                event = ("missing", None, "")
            if event is not None:
                with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()

    def wait(self, since: int, wanted) -> tuple[str, str | None, str] | None:
        """The first event after index ``since`` for which ``wanted(event)``; None on a hang."""
        deadline = time.monotonic() + HANG_SECONDS
        with self._changed:
            while True:
                for event in self.events[since:]:
                    if wanted(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)



def test_reload_edits_against_the_real_controller(tmp_path):
    rng = random.Random(seed())
    root = tmp_path / "etc"
    root.mkdir()
    ledger_dir = tmp_path / "ledger"
    directory = Directory(root)
    other_gib = 1
    first = valid_policy(0, other_gib)
    directory.atomic_rename(first)
    controller = subprocess.Popen(
        [sys.executable, "-m", "kvpolicy.cli", "run", str(directory.path), "--ledger-dir", str(ledger_dir),
         "--gpu-capacity", f"{CAPACITY_GIB}GiB", "--metrics-address", "off", "--log-level", "INFO",
         "--reload-quiet", str(QUIET)],
        stderr=subprocess.PIPE, text=True, errors="backslashreplace",
    )
    log = ControllerLog(controller.stderr)
    engines = None
    try:
        assert log.wait(0, lambda e: e[:2] == ("loaded", sha(first))), "the controller never loaded the first policy"
        assert wait_for(lambda: (ledger_dir / "status.json").exists(), HANG_SECONDS)
        engines = subprocess.Popen([sys.executable, "-c", ENGINES, str(ledger_dir)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        assert read_line(engines).strip() == "attached"

        def limit() -> int | None:
            slot = LedgerDir(ledger_dir).read().find("engine/0")
            return slot.limit if slot else None

        expected = engine_limit(other_gib)
        assert wait_for(lambda: limit() == expected, HANG_SECONDS)
        valid_saves = {sha(first)}
        prefixes: set[str] = set()
        counts: Counter = Counter()
        edits = scaled(RELOAD_EDITS)
        n = 0
        while n < edits:
            n += 1
            since = len(log.events)
            how = rng.choice(["in_place", "in_place", "slow_in_place", "slow_in_place", "atomic_rename",
                              "atomic_rename", "editor_backup", "configmap_swap", "configmap_swap",
                              "symlink_elsewhere", "symlink_elsewhere", "delete", "unreadable", "directory"])
            if how in ("delete", "unreadable", "directory"):
                if how == "delete":
                    directory.delete()
                elif how == "directory":
                    directory.directory_in_place()
                else:
                    how = f"unreadable ({directory.unreadable()})"
                counts[how] += 1
                assert log.wait(since, lambda e: e[0] == "missing"), f"edit {n} ({how}) was never noticed"
                assert limit() == expected, f"edit {n} ({how}) changed the published limit"
                how, since = "atomic_rename", len(log.events)  # ...and it comes back, as edit n + 1
                n += 1
            if how in ("in_place", "slow_in_place", "editor_backup") and not directory.is_plain():
                how = "atomic_rename"  # a plain file again, as an edit of its own, before one is saved in place
            kind = rng.choice(["valid", "valid", "valid", "invalid", "truncated"])
            value = rng.randint(1, 60)
            if kind == "valid":
                data = valid_policy(n, value)
            elif kind == "invalid":
                data = f"# edit {n}\n".encode() + rng.choice(INVALID)
            else:
                full = valid_policy(n, value)
                data = full[: rng.randrange(len(f"# edit {n}\n"), len(full))]
            is_valid = lint_bytes(data, "t").policy is not None
            counts[f"{kind}/{how}"] += 1
            if is_valid:
                valid_saves.add(sha(data))
            halves: list[bytes] = []
            exposed = 0.0
            if how == "in_place":
                exposed = directory.in_place(data, rng, on_intermediate=halves.append)
            elif how == "slow_in_place":
                cut = rng.randrange(len(data) + 1)
                halves.append(data[:cut])
                exposed = directory.slow_in_place(data, cut, rng.uniform(0.015, 0.040))
            elif how == "atomic_rename":
                directory.atomic_rename(data)
            elif how == "editor_backup":
                directory.editor_backup(data)
            elif how == "configmap_swap":
                directory.configmap_swap(data)
            else:
                directory.symlink_elsewhere(data, rng)
            excused = {sha(h) for h in halves if exposed >= QUIET and lint_bytes(h, "t").policy is not None}
            valid_saves |= excused
            if how == "slow_in_place":
                prefixes.add(sha(halves[0]))
            outcome = log.wait(since, lambda e: e[1] == sha(data))  # noqa: B023 - waited for in this iteration
            assert outcome is not None, f"edit {n} ({kind}/{how}) was never looked at"
            assert outcome[0] == ("loaded" if is_valid else "rejected"), f"edit {n} ({kind}/{how}): {outcome}"
            if is_valid:  # published before the status names it: the controller publishes, then writes status
                assert wait_for(lambda: (st := read_status(ledger_dir)) is not None and st.policy is not None
                                and st.policy.sha256 == sha(data), HANG_SECONDS), f"edit {n} ({kind}/{how}) never reached status"  # noqa: B023 - waited for here
                if kind == "valid":
                    expected = engine_limit(value)
                    assert limit() == expected, f"edit {n} ({kind}/{how}) was not published"
                else:
                    expected = limit()  # a valid prefix: whatever it publishes is the new last good
            else:
                went_live = {e[1] for e in log.events[since:] if e[0] == "loaded"} & excused
                if went_live:  # the stalled save's first half is the new last good
                    assert wait_for(lambda: (st := read_status(ledger_dir)) is not None and st.policy is not None
                                    and st.policy.sha256 in went_live, HANG_SECONDS)  # noqa: B023 - waited for here
                    expected = limit()
                assert limit() == expected, f"edit {n} ({kind}/{how}) replaced the published limit: {log.events[-6:]}"
        loaded = {e[1] for e in log.events if e[0] == "loaded"}
        assert loaded <= valid_saves, "content that was never a valid save went live"
        assert not loaded & (prefixes - valid_saves), "a prefix of a slow save went live"  # unless excused above
        assert len(counts) == 6 * 3 + 3, counts  # every way of saving with every kind of content, and each way of breaking it
        assert controller.poll() is None, "the controller exited"
    finally:
        if engines is not None:
            engines.kill()
            engines.wait()
        controller.terminate()
        controller.wait(HANG_SECONDS)

