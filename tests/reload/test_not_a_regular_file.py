"""A policy path that is not a regular file (a FIFO, a device, a socket, a directory), and SIGHUP's re-read.

The watcher reads its file again at every change, so only a regular file will do: a FIFO's
open blocks until a writer comes (the watcher's thread would hang, silently, for good) and
``/dev/zero`` never ends. Such a path is refused unopened, recorded like a missing file, and
a regular file put back is read as usual. Real files, FIFOs and the real watchdog observer;
every wait is on a condition, bounded only to catch a hang.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kvpolicy.runtime import watch
from kvpolicy.runtime.watch import PolicyWatcher
from tests.support.policy_saves import sha
from tests.support.waiting import wait_for

HANG = 120.0  # only to catch a hang: nothing here waits for a time to pass
NEVER = 3600.0  # a poll or quiet period that never comes during a test


def policy(n: int) -> bytes:
    return f'version 1\nmodel "m{n}" {{ priority {n}; min 1 GiB }}\n'.encode()


def replace(path: Path, data: bytes) -> None:
    """Save ``data`` at ``path`` as editors do: a new file renamed over whatever is there."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def release_a_blocked_reader(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it: a reader blocked in open() (a watcher without the
    fix) returns, so a failing test leaves no thread hung behind it."""
    try:
        if stat.S_ISFIFO(os.lstat(fifo).st_mode):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waiting (ENXIO), or no FIFO there any more


def a_fifo(path: Path) -> str:
    os.mkfifo(path)
    return "the policy path is a FIFO (named pipe), not a regular file"


def a_directory(path: Path) -> str:
    path.mkdir()
    return "the policy path is a directory, not a regular file"


def a_socket(path: Path) -> str:
    if len(os.fsencode(path)) >= 100:
        pytest.skip("the temporary path is too long for a Unix socket's name")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # its name stays in the directory
    return "the policy path is a socket, not a regular file"


def a_link_to_dev_zero(path: Path) -> str:
    if not stat.S_ISCHR(os.stat("/dev/zero").st_mode):
        pytest.skip("no /dev/zero device here")
    path.symlink_to("/dev/zero")
    return "the policy path leads to /dev/zero, a character device, not a regular file"


KINDS: dict[str, Callable[[Path], str]] = {
    "fifo": a_fifo, "directory": a_directory, "socket": a_socket, "link to /dev/zero": a_link_to_dev_zero,
}


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_the_first_read_refuses_what_is_not_a_regular_file_without_blocking(tmp_path, make, caplog):
    """``check_now`` (the controller's first load) on a FIFO with no writer used to block forever."""
    path = tmp_path / "policy.kvp"
    expected = make(path)
    watcher = PolicyWatcher(path)
    swapped: list[bool] = []
    reader = threading.Thread(target=lambda: swapped.append(watcher.check_now()), daemon=True)
    with caplog.at_level(logging.WARNING, logger="kvpolicy.watch"):
        reader.start()
        reader.join(HANG)
    if reader.is_alive():
        release_a_blocked_reader(path)
        pytest.fail(f"check_now() was still blocked after {HANG:.0f} s")
    assert swapped == [False] and watcher.current is None
    last = watcher.last_reload
    assert last is not None and not last.ok and last.message == expected
    # Nothing is in force, so it is an error: `kvpolicy run` shows it at any --log-level as why it stops.
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, f"policy {path}: {expected}; no policy in force")]


def test_a_fifo_put_in_place_of_the_policy_is_refused_and_a_file_put_back_is_read(tmp_path):
    """The audit's live case: ``rm p.kvp; mkfifo p.kvp`` under a running watcher, then a good file again."""
    path = tmp_path / "policy.kvp"
    path.write_bytes(policy(1))
    watcher = PolicyWatcher(path, poll_interval=NEVER)  # events alone must see it
    watcher.start()
    try:
        good = watcher.current
        assert good is not None and good.sha256 == sha(policy(1))
        path.unlink()
        os.mkfifo(path)
        fifo = "the policy path is a FIFO (named pipe), not a regular file"
        assert wait_for(lambda: watcher.last_reload.message == fifo, HANG), (
            f"the FIFO was never reported; last reload: {watcher.last_reload}")
        assert watcher.current is good  # the last good policy stays
        replace(path, policy(2))
        assert wait_for(lambda: watcher.current.sha256 == sha(policy(2)), HANG), "the file put back was never read"
        assert watcher.last_reload.ok and watcher.current.trigger == "moved"
    finally:
        release_a_blocked_reader(path)
        watcher.stop()
    assert watcher._thread is not None
    watcher._thread.join(HANG)
    assert not watcher._thread.is_alive(), "the watcher's thread did not end"


def test_a_symlink_to_dev_zero_is_refused_once_and_never_read(tmp_path, monkeypatch):
    """``ln -sf /dev/zero p.kvp.new && mv -T p.kvp.new p.kvp`` used to re-read 1 MiB of zeros every 10 ms
    without a word: now the device is never read, and the failure is recorded once however often
    the watcher looks again."""
    if not stat.S_ISCHR(os.stat("/dev/zero").st_mode):
        pytest.skip("no /dev/zero device here")
    reads: list[int] = []  # the size of every read of the policy's bytes
    read_stream = watch.read_policy_stream

    def counted(stream, limit=None):  # type: ignore[no-untyped-def]
        data = read_stream(stream, limit)
        reads.append(len(data))
        return data

    monkeypatch.setattr(watch, "read_policy_stream", counted)
    path = tmp_path / "policy.kvp"
    path.write_bytes(policy(1))
    watcher = PolicyWatcher(path, poll_interval=0.01)  # looks again all the time
    looks = [0]
    read = watcher._read

    def counted_read():  # type: ignore[no-untyped-def]
        looks[0] += 1
        return read()

    watcher._read = counted_read  # type: ignore[method-assign]
    watcher.start()
    try:
        good = watcher.current
        link = tmp_path / "policy.kvp.new"
        link.symlink_to("/dev/zero")
        os.replace(link, path)
        device = "the policy path leads to /dev/zero, a character device, not a regular file"
        assert wait_for(lambda: watcher.last_reload.message == device, HANG)
        failures, reads_before, looked = watcher.failures, len(reads), looks[0]
        assert wait_for(lambda: looks[0] >= looked + 20, HANG), "the watcher stopped looking"
        assert len(reads) == reads_before  # the device is never read
        assert watcher.failures == failures and watcher.last_reload.message == device  # recorded once
        assert watcher.current is good
        replace(path, policy(2))
        assert wait_for(lambda: watcher.current.sha256 == sha(policy(2)), HANG)
    finally:
        watcher.stop()


def test_a_reread_takes_a_change_no_event_or_poll_reported_and_logs_what_it_found(tmp_path, caplog):
    """``reread()``, kvpolicy run's SIGHUP: with no observer and no poll, nothing else would read the file."""
    path = tmp_path / "policy.kvp"
    path.write_bytes(policy(1))
    watcher = PolicyWatcher(path, quiet=NEVER, poll_interval=NEVER)
    watcher.check_now()
    thread = threading.Thread(target=watcher._loop, daemon=True)  # the schedule without watchdog
    thread.start()
    try:
        with caplog.at_level(logging.INFO, logger="kvpolicy.watch"):
            path.write_bytes(policy(2))
            watcher.reread()
            assert wait_for(lambda: watcher.current.sha256 == sha(policy(2)), HANG)
            assert watcher.current.trigger == "sighup" and watcher.current.revision == 2

            caplog.clear()
            watcher.reread()  # nothing changed: it says so
            said = f"policy {path} read again on SIGHUP: unchanged; keeping revision 2"
            assert wait_for(lambda: said in caplog.messages, HANG), caplog.messages

            path.write_bytes(b'version 1\nmodel "x" { min 4 GiBB }\n')
            watcher.reread()
            assert wait_for(lambda: not watcher.last_reload.ok, HANG)
            caplog.clear()
            watcher.reread()
            said = (f"policy {path} read again on SIGHUP: unchanged and still refused ({path}:2:19: KV001 error: "
                    "unknown unit 'GiBB'); keeping revision 2")
            assert wait_for(lambda: said in caplog.messages, HANG), caplog.messages
    finally:
        watcher._stop.set()
        with watcher._wake:
            watcher._wake.notify()
        thread.join(HANG)


def test_a_rejected_policy_is_logged_once_with_its_line_and_caret(tmp_path, caplog):
    """As ``kvpolicy lint`` shows it; an error while no policy is in force, a warning once one is kept."""
    path = tmp_path / "policy.kvp"
    path.write_bytes(b'version 1\nmodel "x" { min 4 GiBB }\n')
    shown = [
        f"{path}:2:19: KV001 error: unknown unit 'GiBB'",
        '   2 | model "x" { min 4 GiBB }',
        "     |                   ^^^^",
        "  hint: did you mean 'GiB'?",
    ]
    watcher = PolicyWatcher(path, quiet=NEVER, poll_interval=NEVER)
    with caplog.at_level(logging.INFO, logger="kvpolicy.watch"):
        watcher.check_now()
        path.write_bytes(policy(1))
        watcher.check_now()
        path.write_bytes(b'version 1\nmodel "x" { min 4 GiBB }\n# again\n')
        watcher.check_now()
    rejected = [r for r in caplog.records if " rejected (sha256 " in r.getMessage()]
    assert [r.levelno for r in rejected] == [logging.ERROR, logging.WARNING]
    first, second = (r.getMessage().splitlines() for r in rejected)
    assert first[0].endswith(", check), no policy in force:") and first[1:] == shown
    assert second[0].endswith(", check), keeping revision 1:") and second[1:] == shown


def test_a_source_line_too_long_for_a_log_is_left_out(tmp_path, caplog):
    path = tmp_path / "policy.kvp"
    path.write_bytes(b'version 1\nmodel "x" { min 4 GiBB }' + b" " * watch.MAX_LOGGED_LINE + b"\n")
    watcher = PolicyWatcher(path)
    with caplog.at_level(logging.ERROR, logger="kvpolicy.watch"):
        watcher.check_now()
    (record,) = caplog.records
    assert record.getMessage().splitlines()[1:] == [f"{path}:2:19: KV001 error: unknown unit 'GiBB'",
                                                    "  hint: did you mean 'GiB'?"]
