"""Hot reload torture: real files, real watchdog, every way a policy file gets saved.

Over 1,000 edits mix in-place writes, atomic renames, Kubernetes ConfigMap
``..data`` symlink swaps, truncated writes, invalid content, and delete +
recreate. Whatever happens, the running policy is always content that was
written and lints clean, and after each valid save it converges to that save.
"""

from __future__ import annotations

import random
import threading

import pytest

from kvpolicy.lint.engine import lint_text
from kvpolicy.runtime.watch import LoadedPolicy, PolicyWatcher
from tests.support.policy_saves import Directory, sha
from tests.support.waiting import wait_for

EDITS = 1000
QUIET = 2.0
"""Far above the two writes of an in-place save; each edit that ends without a final event waits it out.
A save that did stall this long may have its valid first half go live (the watcher's documented limit):
the writer measures how long each half stood in the file, and only then is that excused."""
CONVERGE_TIMEOUT = 120.0  # only catches a hang: a converging wait returns at once


def valid_policy(n: int) -> str:
    return (
        "version 1\n"
        f"# edit {n}\n"
        "defaults { headroom 2 GiB }\n"
        f'model "m{n}" {{\n  priority {n % 1000}\n  min {1 + n % 7} GiB\n}}\n'
        'rule "idle" {\n  when model.idle > 60s\n  shrink to min\n  grace 30s\n}\n'
    )


INVALID = (
    "",  # an empty file: no version
    "version 1\nmodel \"x\" { reserve 4 GiBB }\n",
    "version 1\nmodel \"x\" {\n  priority\n",
    "model \"x\" { priority 1 }\n",
    "version 1\nrule \"r\" { when gpu.fre < 1 GiB; shrink to min; grace 1s }\n",
    "\xff\xfe not utf-8",
)


def lints_clean(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return lint_text(text, "t").policy is not None


@pytest.mark.slow
def test_active_policy_is_always_the_last_valid_content(tmp_path):
    rng = random.Random(20261129)
    directory = Directory(tmp_path)
    first = valid_policy(0).encode()
    directory.atomic_rename(first)
    written_valid: set[str] = {sha(first)}
    saves: set[str] = {sha(first)}  # complete valid saves
    excused: set[str] = set()  # valid halves of in-place saves that stood in the file for QUIET or longer
    written_lock = threading.Lock()
    swaps: list[LoadedPolicy] = []
    bad_swaps: list[str] = []

    def on_change(loaded: LoadedPolicy) -> None:
        with written_lock:
            known = loaded.sha256 in written_valid
        if not known:
            bad_swaps.append(loaded.sha256)
        swaps.append(loaded)

    intermediate = b""

    def remember_if_valid(content: bytes) -> None:
        nonlocal intermediate
        intermediate = content
        if lints_clean(content):
            with written_lock:
                written_valid.add(sha(content))

    # A quiet period far above any stall between the two writes of an in-place save: its prefix
    # (valid, for some truncated or invalid edits) must never look final for being quiet.
    watcher = PolicyWatcher(directory.path, on_change=on_change, debounce=0.005, poll_interval=0.25, quiet=QUIET)
    watcher.start()
    try:
        assert watcher.current is not None and watcher.current.sha256 == sha(first)
        counts: dict[str, int] = {}
        last_valid = sha(first)
        for n in range(1, EDITS + 1):
            kind = rng.choice(["valid", "valid", "valid", "invalid", "truncated", "delete"])
            how = rng.choice(["in_place", "atomic_rename", "configmap_swap"])
            counts[f"{kind}/{how}"] = counts.get(f"{kind}/{how}", 0) + 1
            if kind == "delete":
                failures = watcher.failures
                directory.delete()
                assert wait_for(lambda: watcher.failures > failures and watcher.last_reload.sha256 is None,  # noqa: B023 - waited for here
                                CONVERGE_TIMEOUT), f"edit {n}: the deleted file was never noticed"
                assert watcher.current.sha256 == last_valid  # a missing file changes nothing
                kind, how = "valid", "atomic_rename"  # ...and it comes back
            if kind == "valid":
                data = valid_policy(n).encode()
            elif kind == "invalid":
                data = rng.choice(INVALID).encode("utf-8", "surrogateescape") + f"# {n}\n".encode()
            else:
                full = valid_policy(n).encode()
                data = full[: rng.randrange(len(full))]
            is_valid = lints_clean(data)
            if is_valid:
                with written_lock:
                    written_valid.add(sha(data))
                saves.add(sha(data))
            may_be_live = {last_valid}
            if how == "in_place":
                exposed = directory.in_place(data, rng, on_intermediate=remember_if_valid)
                if exposed >= QUIET and lints_clean(intermediate):
                    excused.add(sha(intermediate))
                    may_be_live.add(sha(intermediate))
            elif how == "atomic_rename":
                directory.atomic_rename(data)
            else:
                directory.configmap_swap(data)
            if is_valid:
                assert wait_for(lambda: watcher.current.sha256 == sha(data), CONVERGE_TIMEOUT), (  # noqa: B023 - waited for here
                    f"edit {n} ({kind}/{how}) did not converge")
                last_valid = sha(data)
            else:
                assert wait_for(lambda: watcher.last_reload is not None and watcher.last_reload.sha256 in (sha(data), None),  # noqa: B023 - waited for here
                                CONVERGE_TIMEOUT), (
                    f"edit {n} ({kind}/{how}) was never looked at"
                )
                assert watcher.current.sha256 in may_be_live, f"edit {n} ({kind}/{how}) replaced the running policy"
                last_valid = watcher.current.sha256
        assert not bad_swaps, "a content that was never a valid save became active"
        assert {s.sha256 for s in swaps} - saves <= excused, "the first half of a save went live"
        assert len(counts) >= 12, counts  # every kind of edit in every way happened
        assert watcher.failures > 0 and watcher.reloads > EDITS // 3
        assert [s.revision for s in swaps] == sorted(s.revision for s in swaps)
    finally:
        watcher.stop()


def test_rejected_file_keeps_the_policy_and_reports_position(tmp_path):
    path = tmp_path / "p.kvp"
    path.write_text(valid_policy(1))
    watcher = PolicyWatcher(path, debounce=0.005, poll_interval=0.1)
    watcher.start()
    try:
        good = watcher.current
        path.write_text("version 1\nmodel \"x\" { reserve 4 GiBB }\n")
        assert wait_for(lambda: watcher.last_reload is not None and not watcher.last_reload.ok, CONVERGE_TIMEOUT)
        error = watcher.last_reload.error
        assert (error.line, error.col, error.code) == (2, 25 - 2, "KV001")
        assert watcher.current is good
        path.write_text(valid_policy(2))
        assert wait_for(lambda: watcher.current.revision == 2, CONVERGE_TIMEOUT)
        assert watcher.last_reload.ok
    finally:
        watcher.stop()


def test_poll_catches_changes_without_events(tmp_path):
    """With no observer at all (events lost), the timer alone converges."""
    path = tmp_path / "p.kvp"
    path.write_text(valid_policy(1))
    watcher = PolicyWatcher(path, debounce=0.005, poll_interval=0.05)
    watcher.check_now()
    thread = threading.Thread(target=watcher._loop, daemon=True)  # the timer loop without watchdog
    thread.start()
    try:
        path.write_text(valid_policy(2))
        assert wait_for(lambda: watcher.current.revision == 2, CONVERGE_TIMEOUT)
        assert watcher.current.trigger == "poll"
    finally:
        watcher._stop.set()
        thread.join(timeout=2)


def test_an_error_handling_an_event_is_logged_and_events_keep_coming(tmp_path, caplog):
    """watchdog ends its dispatching thread on a handler's exception: the watcher must not raise one."""
    path = tmp_path / "p.kvp"
    path.write_text(valid_policy(1))
    watcher = PolicyWatcher(path, debounce=0.005, poll_interval=3600.0, quiet=0.2)  # no poll: events only
    handle = watcher.on_event
    failing = threading.Event()
    failing.set()

    def on_event(event):  # type: ignore[no-untyped-def]
        if failing.is_set():
            raise RuntimeError("a bug in handling events")
        handle(event)

    watcher.on_event = on_event  # type: ignore[method-assign]
    watcher.start()
    try:
        with caplog.at_level("ERROR", logger="kvpolicy.watch"):
            path.write_text(valid_policy(2))
            assert wait_for(lambda: watcher.current.revision == 2, CONVERGE_TIMEOUT)
        assert watcher.current.trigger == "poll"  # the failed event asked for a check
        assert "a bug in handling events" in caplog.text
        failing.clear()
        path.write_text(valid_policy(3))
        assert wait_for(lambda: watcher.current.revision == 3, CONVERGE_TIMEOUT)
        assert watcher.current.trigger != "poll"  # an event, so the observer still dispatches
    finally:
        watcher.stop()
