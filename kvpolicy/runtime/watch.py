"""Hot reload: keep the last good policy of a file, whatever happens to the file.

A policy goes live only once it is complete. The kernel says when a writer is done
(inotify's close-write, watchdog's ``FileClosedEvent``) and when a complete file
arrives at once (a rename over the policy, a symlink created or re-pointed, the
kubelet's ``..data`` swap): after such an event the file is read ``debounce``
seconds later. Anything else — a modify or attribute event, a creation, a
deletion, or the ``poll_interval`` timer that catches lost events — says only
that something changed: the file must then stay unchanged (inode, size, mtime and
SHA-256) for ``quiet`` seconds before it is read as final. So a slow in-place save
(truncate, write part, pause, write the rest) never activates its prefix: the
prefix is neither closed nor quiet. A modify event after a close-write (the next
save began) turns the pending read back into a quiet-period one, and so does a
file whose inode, size or mtime moved since the close-write was seen.

The watcher observes directories, not the file: editors rename a temporary file
over the policy and the kubelet swaps a symlink, and a watch on the file would
follow the old inode. It watches the directory of every name on the policy's
chain of symlinks (``kvpolicy.runtime.links``), so a policy that is a symlink into
another directory is seen by events too, and it re-resolves the chain at every
check, so a re-pointed link moves the watches with it. New content is parsed and
linted; only a policy without errors replaces the running one. A failure is kept
as ``last_reload`` (with file:line:col), and the running policy stays.

The policy must be a regular file (or a symlink to one): the watcher reads it again at
every change, which a FIFO or a device cannot give (a FIFO's open blocks until a
writer comes, ``/dev/zero`` never ends). Anything else is refused before it is opened,
and again on the open file, opened so that it cannot block (``paths.open_regular``),
and recorded like a missing file; the running policy stays, and a regular file put back
is read as usual. ``reread()`` (``kvpolicy run``'s SIGHUP) asks for a read now, as a
close-write would.

At start the first read is taken as final, but a file that cannot be loaded then may be
a save caught half-way: ``start(wait=...)`` watches it, as above, for up to ``wait``
seconds more and returns as soon as a policy loads. The refusals it meets meanwhile are
logged as information, and only the last one, if no policy loaded, as the error it is.

What events cannot tell: a writer that closes the file in the middle of a save
and reopens it, or one that pauses for longer than ``quiet`` without closing. And
one race is only narrowed: a save that starts before the previous save's final
event is handled is caught by its modify events (handled next, well within
``debounce``) or by the file's identity moving after the final event was seen.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.budget import RELOAD_WORK_BUDGET
from kvpolicy.lint.engine import lint_bytes
from kvpolicy.lint.report import render_diagnostic
from kvpolicy.lint.source import read_policy_stream
from kvpolicy.paths import NotRegularFile, open_regular, reason
from kvpolicy.policy.model import Policy
from kvpolicy.runtime.links import Chain, resolve_chain

if TYPE_CHECKING:  # watchdog is the runtime extra's, imported when watching starts
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers.api import BaseObserver, ObservedWatch

log = logging.getLogger("kvpolicy.watch")

DEFAULT_DEBOUNCE = 0.02
DEFAULT_QUIET = 0.3
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_START_WAIT = 2.0
"""``kvpolicy run``'s ``--start-wait``: how long a policy that cannot be loaded at start is watched for
a save that completes it, before the start is refused."""
_STOP_CHECK = 0.1
"""While ``start`` waits, how often it looks at the caller's stop event."""

MAX_LOGGED_LINE = 500
"""A rejected policy's log line shows the source line of its error, with a caret, up to this many
characters (a longer one, such as a 1 MiB policy on one line, is left out: file:line:col says where)."""

Trigger = Literal["check", "sighup", "close-write", "moved", "modified", "created", "deleted", "poll"]
"""What made the watcher read the file. ``check``: an explicit ``check_now()`` (the first
load, ``run --once``). ``close-write`` and ``moved`` (a rename into place, a symlink created
or re-pointed), and ``sighup`` (``reread()``: the operator says the file is saved): final,
read after ``debounce``. The others: read once the file has been quiet for ``quiet`` seconds."""

@dataclass(frozen=True)
class LoadedPolicy:
    """The policy in force and where it came from."""

    policy: Policy
    sha256: str
    revision: int
    """1 for the first policy loaded, +1 for every successful reload."""
    loaded_at: float
    trigger: Trigger = "check"
    """What noticed the change that loaded it."""


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    at: float
    sha256: str | None
    error: Diagnostic | None = None
    """The first error of a rejected file (None when ``ok``)."""
    message: str | None = None
    """For failures that are not diagnostics: the file is missing or unreadable."""
    trigger: Trigger = "check"


@dataclass(frozen=True)
class _Snapshot:
    """The file's bytes, read while its inode, size and mtime stayed put."""

    data: bytes
    sha256: str
    identity: tuple[int, int, int, int]
    """(device, inode, size, mtime_ns)."""

    @property
    def signature(self) -> tuple[tuple[int, int, int, int], str]:
        return self.identity, self.sha256


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class _EventKinds:
    """The watchdog event classes the watcher tells apart, as this watchdog names them."""

    ignored: tuple[type, ...]
    closed: tuple[type, ...]
    moved: tuple[type, ...]
    created: tuple[type, ...]
    modified: tuple[type, ...]


@functools.cache
def _event_kinds() -> _EventKinds:
    """The classes of ``watchdog.events`` by name, leaving out those this version lacks: a watchdog
    never sends an event it has no class for. (FileClosedNoWriteEvent came in 5.0; before 7.0 an
    attribute change, such as a touch or a chmod, is a FileModifiedEvent, then a FileAttribEvent.)"""
    from watchdog import events

    def present(*names: str) -> tuple[type, ...]:
        return tuple(getattr(events, name) for name in names if hasattr(events, name))

    return _EventKinds(
        ignored=present("FileOpenedEvent", "FileClosedNoWriteEvent", "DirModifiedEvent"),
        closed=present("FileClosedEvent"),
        moved=present("FileMovedEvent"),
        created=present("FileCreatedEvent"),
        modified=present("FileModifiedEvent", "FileAttribEvent"),
    )


class PolicyWatcher:
    """Watches one policy file; ``current`` is always the last good policy.

    ``on_change(loaded)`` runs (on the watcher's thread) after every successful
    swap; ``on_reload(result)`` after every attempt, good or bad.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        on_change: Callable[[LoadedPolicy], None] | None = None,
        on_reload: Callable[[ReloadResult], None] | None = None,
        debounce: float = DEFAULT_DEBOUNCE,
        quiet: float = DEFAULT_QUIET,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if quiet < debounce:
            raise ValueError(f"the quiet period ({quiet}s) must not be shorter than the debounce ({debounce}s)")
        self.path = Path(path)
        self.display_name = str(path)
        self.on_change = on_change
        self.on_reload = on_reload
        self.debounce = debounce
        self.quiet = quiet
        self.poll_interval = poll_interval
        self.clock = clock
        self.current: LoadedPolicy | None = None
        self.last_reload: ReloadResult | None = None
        self.reloads = 0
        self.failures = 0
        self.chain: Chain = resolve_chain(self.path)
        self._seen_sha: str | None = None
        self._lock = threading.Lock()  # one check at a time
        self._wake = threading.Condition()  # guards the schedule below
        self._final_at: float | None = None
        """When a final event (close-write, moved) was seen, while its read is pending."""
        self._final_trigger: Trigger = "close-write"
        self._final_identity: tuple[int, int, int, int] | None = None
        """The file's identity when the final event was handled: a read that finds another one settles."""
        self._settle_at: float | None = None
        self._settle_trigger: Trigger = "poll"
        self._candidate: tuple[tuple[tuple[int, int, int, int], str], float, Trigger] | None = None
        """(signature, first seen (monotonic), trigger) of new content waiting out the quiet period."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: BaseObserver | None = None
        self._watches: dict[str, ObservedWatch] = {}
        self._handler: FileSystemEventHandler | None = None
        self._in_force = threading.Event()
        """Set once a policy is in force."""
        self._holding: float | None = None
        """While ``start`` waits for a first policy: its wait, and refusals are held (``_held``)."""
        self._held: str | None = None
        """The last refusal met while ``start`` waited, logged as an error if no policy loads."""

    # ---- checking ------------------------------------------------------------------

    def check_now(self) -> bool:
        """Read the file now and take it as final: the caller knows it is complete
        (the first load, ``run --once``). True if the policy was swapped."""
        with self._lock:
            snapshot = self._read()
            if snapshot is None or snapshot.sha256 == self._seen_sha:
                return False
            loaded = self._load(snapshot, "check")
        return self._changed(loaded)

    def _final_check(self, trigger: Trigger, identity: tuple[int, int, int, int] | None) -> bool:
        """After a final event: take the file unless it moved since the event was seen."""
        with self._lock:
            snapshot = self._read()
            if snapshot is None or snapshot.sha256 == self._seen_sha:
                self._candidate = None
                if trigger == "sighup":  # nothing new to log otherwise: say what the signal found
                    log.info("policy %s read again on SIGHUP: %s", self.display_name, self._standing(snapshot))
                return False
            if identity is not None and snapshot.identity != identity:
                settle = True  # written again since the close-write: wait for quiet
            else:
                settle = False
                loaded = self._load(snapshot, trigger)
        if settle:
            return self._settle_check(trigger)
        return self._changed(loaded)

    def _settle_check(self, trigger: Trigger) -> bool:
        """Take the file once it has looked the same for ``quiet`` seconds; else look again then."""
        with self._lock:
            snapshot = self._read()
            if snapshot is None or snapshot.sha256 == self._seen_sha:
                self._candidate = None
                return False
            now = time.monotonic()
            candidate = self._candidate
            if candidate is None or candidate[0] != snapshot.signature:
                first = trigger if candidate is None else candidate[2]
                self._candidate = (snapshot.signature, now, first)
                self._schedule_settle(now + self.quiet, first)
                return False
            if now - candidate[1] < self.quiet:
                self._schedule_settle(candidate[1] + self.quiet, candidate[2])
                return False
            loaded = self._load(snapshot, candidate[2])
        return self._changed(loaded)

    def _load(self, snapshot: _Snapshot, trigger: Trigger) -> LoadedPolicy | None:
        """Validate ``snapshot``; swap it in if it has no errors (called with the lock held)."""
        self._seen_sha = sha = snapshot.sha256
        self._candidate = None
        now = self.clock()
        result = lint_bytes(snapshot.data, self.display_name, budget=RELOAD_WORK_BUDGET)
        if result.policy is None:
            error = result.errors[0]
            self.failures += 1
            self._record(ReloadResult(ok=False, at=now, sha256=sha, error=error, trigger=trigger))
            text = result.text if result.text is not None else snapshot.data.decode("utf-8", errors="replace")
            self._log_failure(f"policy {self.display_name} rejected (sha256 {sha}, {trigger}), {self._keeping()}:\n"
                              f"{_shown(error, text)}", f"{error.code} at {error.line}:{error.col}")
            return None
        revision = self.current.revision + 1 if self.current else 1
        loaded = LoadedPolicy(policy=result.policy, sha256=sha, revision=revision, loaded_at=now, trigger=trigger)
        # The result first: whoever sees the new policy in `current` also sees its reload as ok.
        self._record(ReloadResult(ok=True, at=now, sha256=sha, trigger=trigger))
        self.reloads += 1
        self.current = loaded
        self._in_force.set()
        log.info("policy %s revision %d loaded (sha256 %s, %s)", self.display_name, revision, sha, trigger)
        return loaded

    def _changed(self, loaded: LoadedPolicy | None) -> bool:
        if loaded is None:
            return False
        if self.on_change is not None:
            self.on_change(loaded)
        return True

    def _read(self) -> _Snapshot | None:
        """The file's bytes if they held still while read; None if missing, unreadable, not a
        regular file, or moving."""
        self.chain = resolve_chain(self.path)
        self._reconcile_watches()  # before reading: a write after this read is seen by an event
        try:
            with open_regular(self.path) as f:  # never blocks: a FIFO or a device is refused unopened
                before = os.fstat(f.fileno())
                data = read_policy_stream(f)  # at most the size cap + 1 byte (then KV026)
                after = os.fstat(f.fileno())
        except FileNotFoundError:
            self._missing("the policy file does not exist")
            return None
        except NotRegularFile as exc:
            self._missing(self._not_regular(exc))
            return None
        except OSError as exc:
            self._missing(f"cannot read the policy file: {reason(exc)}")
            return None
        whole = len(data) == after.st_size or len(data) < before.st_size  # or cut at the cap
        if _identity(before) != _identity(after) or not whole:
            self._schedule_settle(time.monotonic() + self.debounce, "modified")  # a writer is busy
            return None
        return _Snapshot(data, hashlib.sha256(data).hexdigest(), _identity(after))

    def _not_regular(self, exc: NotRegularFile) -> str:
        """Why the policy path cannot be watched, naming where its symlinks lead."""
        return not_regular_file("the policy path", self.chain, exc)

    def _missing(self, message: str) -> None:
        """Record a file that cannot be read, once for each reason (the poll finds it again and again)."""
        self._candidate = None
        marker = f"unreadable: {message}"  # never a SHA-256: a file that comes back is read as new
        if self._seen_sha != marker:
            self._seen_sha = marker
            self.failures += 1
            self._record(ReloadResult(ok=False, at=self.clock(), sha256=None, message=message))
            self._log_failure(f"policy {self.display_name}: {message}; {self._keeping()}", message)

    def _log_failure(self, message: str, brief: str) -> None:
        """Log a refused read: as its level says, or, while ``start`` waits for a first policy, held
        (``brief`` says why as information meanwhile): a save under way may still complete it."""
        if self._holding is not None and self.current is None:
            self._held = message
            log.info("policy %s cannot be loaded as it is now (%s); watching it up to %gs for a save that "
                     "completes it", self.display_name, brief, self._holding)
            return
        log.log(self._failure_level(), "%s", message)

    def _failure_level(self) -> int:
        """A failure with a policy kept is a warning; with none in force nothing is enforced: an error
        (which ``kvpolicy run`` shows at any ``--log-level``, as its reason for not starting)."""
        return logging.WARNING if self.current is not None else logging.ERROR

    def _keeping(self) -> str:
        return f"keeping revision {self.current.revision}" if self.current else "no policy in force"

    def _standing(self, snapshot: _Snapshot | None) -> str:
        """What a re-read that swapped nothing found: ``snapshot`` None for a file it could not take."""
        last = self.last_reload
        refused = last is not None and not last.ok
        if snapshot is None and not refused:  # _read records what it cannot read: this one was moving
            return "it is being written, and is read once it holds still"
        kept = self._keeping()
        if not refused or last is None:
            return f"unchanged; {kept}"
        why = last.error.render().splitlines()[0] if last.error is not None else last.message
        return f"{'unchanged and ' if snapshot is not None else ''}still refused ({why}); {kept}"

    def _record(self, result: ReloadResult) -> None:
        self.last_reload = result
        if self.on_reload is not None:
            self.on_reload(result)

    # ---- events ----------------------------------------------------------------------

    def start(self, *, wait: float = 0.0, stop: threading.Event | None = None) -> bool:
        """Load the file now and watch the directories of its chain from now on; whether a policy is
        in force when it returns.

        With ``wait``, a file that cannot be loaded now (empty, half-written, not renamed into place
        yet) is watched as any save is, for up to ``wait`` seconds or until ``stop`` is set, and
        ``start`` returns as soon as a policy loads. Refusals meanwhile are logged as information;
        if none loads, the last of them is then logged as the error it is (``kvpolicy run``'s
        reason for not starting, as without a wait)."""
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # An exception here would end watchdog's dispatching thread: no event would arrive
                # again and only the poll would see saves. Log it and let the next check decide.
                try:
                    watcher.on_event(event)
                except Exception:
                    log.exception("policy %s: handling %r failed; the next check reads the file",
                                  watcher.display_name, event)
                    watcher.poke()

        self._handler = _Handler()
        self._observer = Observer()
        self._reconcile_watches()  # watch first: a save during the first read is not missed
        self._observer.start()
        self._holding = wait if wait > 0 else None
        self.check_now()
        self._thread = threading.Thread(target=self._loop, name="kvpolicy-watch", daemon=True)
        self._thread.start()
        if self._holding is None:
            return self.current is not None
        deadline = time.monotonic() + wait
        while not self._in_force.is_set() and not (stop is not None and stop.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._in_force.wait(min(left, _STOP_CHECK))
        with self._lock:  # no read is under way: what is in force now is the answer
            held, self._held, self._holding = self._held, None, None
            in_force = self.current is not None
        if held is not None and not in_force:
            log.error("%s", held)
        return in_force

    def on_event(self, event: FileSystemEvent) -> None:
        """A watchdog event in a watched directory (on the observer's thread)."""
        kinds = _event_kinds()
        if isinstance(event, kinds.ignored):
            return  # readers (this watcher among them) and the directory's own echo of its entries
        chain = self.chain
        names = chain.names
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(getattr(event, "dest_path", "") or "")
        if isinstance(event, kinds.closed) and src == chain.target:
            self._final("close-write")
        elif isinstance(event, kinds.moved) and dest in names:
            self._final("moved")
        elif isinstance(event, kinds.created) and src in names and os.path.islink(src):
            self._final("moved")  # a symlink appears whole
        elif isinstance(event, kinds.modified) and src == chain.target:
            self._settle("modified", downgrade=True)
        elif src in names or dest in names:
            # created (content follows), deleted, moved away, a directory in its place
            self._settle("created" if event.event_type == "created" else "deleted", downgrade=False)
        # Other files in these directories: nothing to do.

    def _final(self, trigger: Trigger) -> None:
        try:
            identity = _identity(os.stat(self.path))
        except OSError:
            identity = None
        with self._wake:
            self._final_at = time.monotonic()
            self._final_trigger = trigger
            self._final_identity = identity
            self._wake.notify()

    def _settle(self, trigger: Trigger, downgrade: bool) -> None:
        with self._wake:
            if downgrade and self._final_at is not None:
                self._final_at = None  # the next save began: its close-write will come, or quiet
            self._settle_at = time.monotonic() + self.debounce
            self._settle_trigger = trigger
            self._wake.notify()

    def _schedule_settle(self, at: float, trigger: Trigger) -> None:
        with self._wake:
            if self._settle_at is None or at < self._settle_at:
                self._settle_at = at
                self._settle_trigger = trigger
            self._wake.notify()

    def reread(self) -> None:
        """Read the file again, as after a close-write: at once if it is unchanged since this call,
        after the quiet period if it is being written (``kvpolicy run``'s SIGHUP). Safe in a signal
        handler: it opens nothing, and takes only the schedule's lock, a re-entrant one."""
        self._final("sighup")

    def poke(self) -> None:
        """Something may have changed: look after ``debounce``, take it after ``quiet``."""
        self._settle("poll", downgrade=False)

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _reconcile_watches(self) -> None:
        """Watch exactly the directories of the current chain (the ones that exist)."""
        observer, handler = self._observer, self._handler
        if observer is None or handler is None:  # not started (start sets both)
            return
        wanted = {d for d in self.chain.directories if os.path.isdir(d)}
        for directory in set(self._watches) - wanted:
            watch = self._watches.pop(directory)
            try:
                observer.unschedule(watch)
            except (KeyError, OSError):
                pass  # its directory is gone, and the watch with it
        for directory in wanted - set(self._watches):
            try:
                self._watches[directory] = observer.schedule(handler, directory, recursive=False)
            except OSError as exc:
                log.warning("cannot watch %s (%s): the %.1fs poll will see its changes", directory, exc,
                            self.poll_interval)

    def _loop(self) -> None:
        next_poll = time.monotonic() + self.poll_interval
        while not self._stop.is_set():
            with self._wake:
                now = time.monotonic()
                due = [next_poll]
                if self._final_at is not None:
                    due.append(self._final_at + self.debounce)
                if self._settle_at is not None:
                    due.append(self._settle_at)
                if now < min(due):
                    self._wake.wait(timeout=min(due) - now)
                    continue
                work: tuple[str, Trigger, tuple[int, int, int, int] | None]
                if self._final_at is not None and now >= self._final_at + self.debounce:
                    work = ("final", self._final_trigger, self._final_identity)
                    self._final_at = None
                    self._settle_at = None
                elif self._settle_at is not None and now >= self._settle_at:
                    work = ("settle", self._settle_trigger, None)
                    self._settle_at = None
                else:
                    work = ("settle", "poll", None)
                    next_poll = now + self.poll_interval
            if self._stop.is_set():
                break
            try:
                if work[0] == "final":
                    self._final_check(work[1], work[2])
                else:
                    self._settle_check(work[1])
            except Exception:  # the watcher must outlive any bad file; the error is logged
                log.exception("policy check failed; keeping the running policy")


def not_regular_file(subject: str, chain: Chain, exc: NotRegularFile) -> str:
    """Why ``subject`` (a policy path, with its ``chain`` of symlinks) cannot be watched: ``SUBJECT is a
    FIFO (named pipe), not a regular file``, or ``SUBJECT leads to TARGET, ...`` when symlinks lead to a
    target that exists (``<(...)``'s leads to a name no path opens: not worth naming)."""
    if chain.links and os.path.lexists(chain.target):
        return f"{subject} leads to {chain.target}, {exc.kind}, not a regular file"
    return f"{subject} is {exc.kind}, not a regular file"


def _shown(error: Diagnostic, text: str) -> str:
    """``error`` as ``kvpolicy lint`` shows it: with its source line and a caret under it (a line
    too long for a log is left out)."""
    lines = text.split("\n")
    too_long = 1 <= error.line <= len(lines) and len(lines[error.line - 1]) > MAX_LOGGED_LINE
    return "\n".join(render_diagnostic(error, None if too_long else lines))
