"""Hot reload: keep the last good policy of a file, whatever happens to the file.

The watcher observes the policy's *directory*, not the file, because editors save
by renaming a temporary file over it and Kubernetes swaps a ConfigMap's ``..data``
symlink: a watch on the file itself would follow the old inode and miss both.
Every event in the directory schedules a check after ``debounce`` seconds of
quiet; a timer checks every ``poll_interval`` seconds anyway (events can be lost:
inotify queue overflows, network filesystems). A check reads the file through
its symlinks and compares its SHA-256 with the last content seen, so irrelevant
events cost one read. New content is parsed and linted; only a policy without
errors replaces the running one. A failure is kept as ``last_reload`` (with
file:line:col), and the running policy stays.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.lint.budget import RELOAD_WORK_BUDGET
from kvpolicy.lint.engine import decode_policy, lint_text
from kvpolicy.lint.source import read_policy_bytes
from kvpolicy.diagnostics import Diagnostic, PolicyError
from kvpolicy.policy.model import Policy

log = logging.getLogger("kvpolicy.watch")


@dataclass(frozen=True)
class LoadedPolicy:
    """The policy in force and where it came from."""

    policy: Policy
    sha256: str
    revision: int
    """1 for the first policy loaded, +1 for every successful reload."""
    loaded_at: float


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    at: float
    sha256: str | None
    error: Diagnostic | None = None
    """The first error of a rejected file (None when ``ok``)."""
    message: str | None = None
    """For failures that are not diagnostics: the file is missing or unreadable."""


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
        debounce: float = 0.02,
        poll_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.display_name = str(path)
        self.on_change = on_change
        self.on_reload = on_reload
        self.debounce = debounce
        self.poll_interval = poll_interval
        self.clock = clock
        self.current: LoadedPolicy | None = None
        self.last_reload: ReloadResult | None = None
        self.reloads = 0
        self.failures = 0
        self._seen_sha: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition()
        self._pending_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer = None

    # ---- checking ------------------------------------------------------------------

    def check_now(self) -> bool:
        """Read the file; if its content is new, validate it and swap. True if swapped."""
        with self._lock:
            data = self._read()
            if data is None:
                return False
            sha = hashlib.sha256(data).hexdigest()
            if sha == self._seen_sha:
                return False
            self._seen_sha = sha
            now = self.clock()
            try:
                result = lint_text(decode_policy(data, self.display_name), self.display_name, sha256=sha, budget=RELOAD_WORK_BUDGET)
            except PolicyError as exc:  # not UTF-8
                return self._reject(now, sha, exc.first)
            if result.policy is None:
                return self._reject(now, sha, result.errors[0])
            revision = self.current.revision + 1 if self.current else 1
            loaded = LoadedPolicy(policy=result.policy, sha256=sha, revision=revision, loaded_at=now)
            # The result first: whoever sees the new policy in `current` also sees its reload as ok.
            self._record(ReloadResult(ok=True, at=now, sha256=sha))
            self.reloads += 1
            self.current = loaded
            log.info("policy %s revision %d loaded (sha256 %s)", self.display_name, revision, sha[:12])
        if self.on_change is not None:
            self.on_change(loaded)
        return True

    def _read(self) -> bytes | None:
        """The file's bytes once they stop changing under us; None if it is missing."""
        for _ in range(5):
            try:
                before = os.stat(self.path)
                data = read_policy_bytes(self.path)  # at most the size cap (+1 byte: KV026)
                after = os.stat(self.path)
            except FileNotFoundError:
                self._missing("the policy file does not exist")
                return None
            except OSError as exc:
                self._missing(f"cannot read the policy file: {exc.strerror}")
                return None
            if (before.st_ino, before.st_size, before.st_mtime_ns) == (after.st_ino, after.st_size, after.st_mtime_ns) and len(data) == after.st_size:
                return data
            time.sleep(self.debounce)  # a writer is busy: read again when it settles
        return data

    def _missing(self, message: str) -> None:
        if self._seen_sha != "missing":
            self._seen_sha = "missing"
            self.failures += 1
            self._record(ReloadResult(ok=False, at=self.clock(), sha256=None, message=message))
            log.warning("policy %s: %s; keeping revision %s", self.display_name, message,
                        self.current.revision if self.current else "none")

    def _reject(self, now: float, sha: str, error: Diagnostic) -> bool:
        self.failures += 1
        self._record(ReloadResult(ok=False, at=now, sha256=sha, error=error))
        log.warning("policy rejected, keeping revision %s: %s",
                    self.current.revision if self.current else "none", error.render())
        return False

    def _record(self, result: ReloadResult) -> None:
        self.last_reload = result
        if self.on_reload is not None:
            self.on_reload(result)

    # ---- watching --------------------------------------------------------------------

    def start(self) -> None:
        """Load the file now and watch its directory from now on."""
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                watcher.poke()

        self.check_now()
        self._observer = Observer()
        self._observer.schedule(_Handler(), str(self.path.parent.resolve()), recursive=False)
        self._observer.start()
        self._thread = threading.Thread(target=self._loop, name="kvpolicy-watch", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Something changed in the directory: check after ``debounce`` of quiet."""
        with self._wake:
            self._pending_since = time.monotonic()
            self._wake.notify()

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        next_poll = time.monotonic() + self.poll_interval
        while not self._stop.is_set():
            with self._wake:
                now = time.monotonic()
                if self._pending_since is not None:
                    quiet_until = self._pending_since + self.debounce
                    if now < quiet_until:
                        self._wake.wait(timeout=quiet_until - now)
                        continue
                    self._pending_since = None
                elif now < next_poll:
                    self._wake.wait(timeout=next_poll - now)
                    continue
            if self._stop.is_set():
                break
            try:
                self.check_now()
            except Exception:  # the watcher must outlive any bad file; the error is logged
                log.exception("policy check failed; keeping the running policy")
            next_poll = time.monotonic() + self.poll_interval
