"""When a save is final: close-write and rename events, or a quiet period; symlinks into other directories.

Real files, the real watchdog observer, writers in other processes. The checks are on
what the watcher published (its ``on_change`` history) and on what noticed a change
(``LoadedPolicy.trigger``), never on how fast it happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from kvpolicy.lint.engine import lint_text
from kvpolicy.runtime.links import MAX_LINKS, resolve_chain
from kvpolicy.runtime.watch import LoadedPolicy, PolicyWatcher
from tests.support.policy_saves import sha
from tests.support.waiting import wait_for
from tests.support.processes import read_line

HANG = 120.0  # only to catch a hang: convergence never depends on the machine's speed
NEVER = 3600.0  # a poll interval that never comes during a test: only events can notice



def save_body(n: int) -> tuple[bytes, int]:
    """A policy and a cut inside it where the prefix is itself a valid, different policy."""
    head = f'version 1\nmodel "a" {{ priority {n % 90 + 1} }}\n'
    tail = f'# save {n}\nmodel "b{n}" {{ priority 2; min 1 GiB }}\n'
    return (head + tail).encode(), len(head)


SLOW_WRITER = textwrap.dedent("""
    import json, os, random, sys, time
    path, plan = sys.argv[1], json.loads(sys.argv[2])
    rng = random.Random(16)
    for data, cut in plan:
        data = data.encode()
        sys.stdin.readline()  # the test says when: after the watcher has taken the save before
        with open(path, "r+b") as f:  # an editor that saves in place, slowly
            f.truncate(0)
            f.write(data[:cut])
            f.flush()
            time.sleep(rng.uniform(0.015, 0.040))
            f.write(data[cut:])
    print("done", flush=True)
""")


def test_slow_in_place_saves_never_publish_a_prefix(tmp_path):
    import json

    path = tmp_path / "policy.kvp"
    first, _ = save_body(0)
    path.write_bytes(first)
    plan = [save_body(n) for n in range(1, 41)]
    complete = {sha(first)} | {sha(data) for data, _ in plan}
    prefixes = {sha(data[:cut]) for data, cut in plan}
    assert all(lint_text(data[:cut].decode()).policy is not None for data, cut in plan)  # each prefix would load
    history: list[LoadedPolicy] = []
    # Every save ends in a close-write, so no save needs the quiet period: with one no test outwaits, a
    # prefix cannot go live however long a loaded machine stalls the writer mid-save. Each save starts
    # once the one before is live (a save begun before the previous close-write is handled is a race the
    # watcher only narrows: see kvpolicy/runtime/watch.py).
    watcher = PolicyWatcher(path, on_change=history.append, quiet=NEVER)
    watcher.start()
    writer = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(path), json.dumps([(d.decode(), c) for d, c in plan])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        for data, _ in plan:
            writer.stdin.write("save\n")
            writer.stdin.flush()
            assert wait_for(lambda: watcher.current.sha256 == sha(data), HANG)  # noqa: B023 - waited for here
        assert writer.communicate(timeout=HANG)[0].strip() == "done"
        published = [loaded.sha256 for loaded in history]
        assert not set(published) & prefixes, "a prefix of a save went live"
        assert set(published) <= complete
        assert [loaded.revision for loaded in history] == list(range(1, 1 + len(history)))
        assert [loaded.trigger for loaded in history] == ["check"] + ["close-write"] * len(plan)  # none for quiet
    finally:
        writer.kill()
        watcher.stop()


HELD_OPEN_WRITER = textwrap.dedent("""
    import sys
    path, text = sys.argv[1], sys.argv[2]
    with open(path, "w") as f:  # write it all, but do not close until told
        f.write(text)
        f.flush()
        print("written", flush=True)
        sys.stdin.readline()
""")


def test_a_save_without_close_goes_live_after_the_quiet_period(tmp_path):
    path = tmp_path / "policy.kvp"
    path.write_bytes(save_body(0)[0])
    watcher = PolicyWatcher(path, quiet=0.2, poll_interval=NEVER)
    watcher.start()
    writer = subprocess.Popen([sys.executable, "-c", HELD_OPEN_WRITER, str(path), save_body(7)[0].decode()],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(writer).strip() == "written"
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(7)[0]), HANG)
        assert writer.poll() is None  # still open: no close-write has happened
        assert watcher.current.trigger == "modified"
    finally:
        writer.communicate("close\n", timeout=HANG)
        watcher.stop()
    assert watcher.current.revision == 2  # the close-write afterwards read the same content: nothing new


def test_a_close_write_goes_live_without_waiting_for_quiet(tmp_path):
    """With a quiet period no test would outwait, a plain save still goes live: by its close-write."""
    path = tmp_path / "policy.kvp"
    path.write_bytes(save_body(0)[0])
    watcher = PolicyWatcher(path, quiet=NEVER, poll_interval=NEVER)
    watcher.start()
    try:
        with open(path, "wb") as f:
            f.write(save_body(1)[0])
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(1)[0]), HANG)
        assert watcher.current.trigger == "close-write"
        tmp = tmp_path / ".policy.kvp.tmp"
        tmp.write_bytes(save_body(2)[0])
        os.replace(tmp, path)
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(2)[0]), HANG)
        assert watcher.current.trigger == "moved"
    finally:
        watcher.stop()


def test_an_edit_of_a_symlinks_target_in_another_directory_is_seen_by_an_event(tmp_path):
    here, there, elsewhere = tmp_path / "etc", tmp_path / "srv", tmp_path / "opt"
    for d in (here, there, elsewhere):
        d.mkdir()
    target = there / "real.kvp"
    target.write_bytes(save_body(0)[0])
    link = here / "policy.kvp"
    link.symlink_to(target)
    watcher = PolicyWatcher(link, quiet=NEVER, poll_interval=NEVER)
    watcher.start()
    try:
        assert watcher.current.sha256 == sha(save_body(0)[0])
        target.write_bytes(save_body(1)[0])  # in place, in the other directory
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(1)[0]), HANG), "the target's edit went unseen"
        assert watcher.current.trigger == "close-write"

        moved = elsewhere / "moved.kvp"
        moved.write_bytes(save_body(2)[0])
        tmp_link = here / ".policy.kvp.link"
        tmp_link.symlink_to(moved)
        os.replace(tmp_link, link)  # re-point the link, atomically
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(2)[0]), HANG)
        assert watcher.current.trigger == "moved"

        moved.write_bytes(save_body(3)[0])  # the new target's directory is watched now
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(3)[0]), HANG)
        assert watcher.current.trigger == "close-write"
        assert os.path.realpath(there) not in watcher._watches  # ...and the old one is not
        target.write_bytes(save_body(4)[0])
        moved.write_bytes(save_body(5)[0])
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(5)[0]), HANG)
        assert sha(save_body(4)[0]) != watcher.current.sha256 and watcher.reloads == 5
    finally:
        watcher.stop()


def test_the_chain_names_every_link_and_the_target(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "policy.kvp").write_text("version 1\n")
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "policy.kvp").symlink_to("..data/policy.kvp")
    chain = resolve_chain(tmp_path / "policy.kvp")
    assert chain.links == (str(tmp_path / "policy.kvp"), str(tmp_path / "..data"))
    assert chain.target == str(tmp_path / "v1" / "policy.kvp")
    assert chain.directories == {str(tmp_path), str(tmp_path / "v1")}

    missing = resolve_chain(tmp_path / "nowhere" / "p.kvp")
    assert (missing.links, missing.target) == ((), str(tmp_path / "nowhere" / "p.kvp"))

    (tmp_path / "loop").symlink_to("loop")
    assert len(resolve_chain(tmp_path / "loop").links) == MAX_LINKS + 1

    (tmp_path / "abs").symlink_to(tmp_path / "v1" / "policy.kvp")
    assert resolve_chain(Path(os.path.relpath(tmp_path / "abs"))).target == str(tmp_path / "v1" / "policy.kvp")


def test_a_file_that_keeps_changing_waits_until_it_holds_still(tmp_path):
    """Seen only by the poll, content must look the same for ``quiet`` seconds: here every
    look finds it changed (the test changes it between looks) until the test stops."""
    path = tmp_path / "policy.kvp"
    path.write_bytes(save_body(0)[0])
    looks, changed = threading.Semaphore(0), threading.Semaphore(0)
    seen = [0]
    watcher = PolicyWatcher(path, quiet=0.05, poll_interval=0.05)
    watcher.check_now()
    read = watcher._read

    def read_then_let_the_test_change_it():
        snapshot = read()
        seen[0] += 1
        if seen[0] <= 8:  # the eighth look, after the last change, waits too: until the test has checked
            looks.release()
            assert changed.acquire(timeout=HANG)  # the next look comes after the next change
        return snapshot

    watcher._read = read_then_let_the_test_change_it
    thread = threading.Thread(target=watcher._loop, daemon=True)  # the timer alone: no observer
    thread.start()
    try:
        for n in range(1, 8):
            assert watcher.current.revision == 1
            assert looks.acquire(timeout=HANG)
            path.write_bytes(save_body(n)[0])  # changed after every look
            changed.release()
        assert looks.acquire(timeout=HANG)
        assert watcher.current.revision == 1
        changed.release()  # not changed this time: from here the content holds still
        assert wait_for(lambda: watcher.current.sha256 == sha(save_body(7)[0]), HANG)
        assert watcher.current.trigger == "poll"
    finally:
        watcher._stop.set()
        thread.join(timeout=HANG)


def test_reading_the_policy_is_no_change(tmp_path):
    """Opening and reading the file (the watcher's own reads among them) schedules no look at it."""
    from watchdog.events import DirModifiedEvent, FileClosedNoWriteEvent, FileOpenedEvent

    path = tmp_path / "policy.kvp"
    path.write_bytes(save_body(0)[0])
    watcher = PolicyWatcher(path)
    watcher.check_now()
    target = watcher.chain.target
    for event in (FileOpenedEvent(target), FileClosedNoWriteEvent(target), DirModifiedEvent(str(tmp_path))):
        watcher.on_event(event)
        assert (watcher._settle_at, watcher._final_at) == (None, None), event
    watcher.on_event(FileOpenedEvent(str(tmp_path / "other.kvp")))
    assert watcher._settle_at is None


def test_a_modify_after_a_close_write_turns_the_read_into_a_quiet_one(tmp_path):
    """The next save began before the close-write's read: that read must wait for quiet."""
    from watchdog.events import FileClosedEvent, FileModifiedEvent

    path = tmp_path / "policy.kvp"
    path.write_bytes(save_body(0)[0])
    watcher = PolicyWatcher(path)
    watcher.check_now()
    watcher.on_event(FileClosedEvent(watcher.chain.target))
    assert watcher._final_at is not None and watcher._final_trigger == "close-write"
    watcher.on_event(FileModifiedEvent(watcher.chain.target))
    assert watcher._final_at is None and watcher._settle_at is not None
