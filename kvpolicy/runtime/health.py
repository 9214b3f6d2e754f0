"""Is the controller alive, and is it doing its job: what ``/healthz`` and ``/readyz`` answer.

- **Liveness** (``/healthz``): the controller's loop runs. The loop writes its heartbeat
  at least every second; a heartbeat older than ``STALE_AFTER`` — the age at which
  ``kvpolicy status`` calls the controller stale — means the loop is wedged, and a
  restart is the cure. Nothing else fails liveness: a bad policy or an unusable ledger
  are not cured by restarting.
- **Readiness** (``/readyz``): the controller can do its job now. A valid policy is in
  force (a rejected reload keeps the last good one, and stays ready); the ledger
  directory passes the ledger's own checks (a directory, not a symlink, owned by this
  user or by the ledger's group with group rw, not writable by others) and this
  process may create files in it; and it has a source of GPU figures (NVML,
  ``--gpu-capacity`` or ``--facts``), without which it only validates.

Each probe is checked when asked, from the controller's current state, so an answer
is never older than the request.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.runtime.controller import Controller
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.segment import Access, check_directory
from kvpolicy.runtime.status import STALE_AFTER


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Probe:
    """One probe's answer: ok when every check is."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> str:
        return json.dumps({
            "ok": self.ok,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }, indent=2) + "\n"


def ledger_directory_problem(path: Path, access: Access) -> str | None:
    """Why the ledger directory cannot be used by this process now, or None if it can."""
    try:
        check_directory(path, access)
    except FileNotFoundError:
        return f"the ledger directory {path} does not exist"
    except LedgerError as exc:
        return str(exc)
    except OSError as exc:
        return f"the ledger directory {path}: {exc.strerror}"
    if not os.access(path, os.W_OK | os.X_OK):
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        return (f"the ledger directory {path} (mode {mode:04o}) does not let this process "
                f"(uid {os.geteuid()}) create files in it")
    return None


class ControllerHealth:
    """The probes of one controller; ``clock`` is the wall clock its heartbeat is written with."""

    def __init__(self, controller: Controller, *, stale_after: float = STALE_AFTER,
                 clock: Callable[[], float] = time.time) -> None:
        self.controller = controller
        self.stale_after = stale_after
        self.clock = clock

    def liveness(self) -> Probe:
        now = self.clock()
        beat = self.controller.heartbeat_at
        if beat is None:
            age = now - self.controller.started_at
            ok = age <= self.stale_after
            detail = f"started {age:.1f}s ago, no heartbeat yet"
        else:
            age = now - beat
            ok = age <= self.stale_after
            detail = f"last heartbeat {age:.1f}s ago"
        if not ok:
            detail += f" (stale after {self.stale_after:g}s): the controller loop is not running"
        return Probe((Check("loop", ok, detail),))

    def readiness(self) -> Probe:
        return Probe((self._policy(), self._ledger(), self._figures()))

    def _policy(self) -> Check:
        watcher = self.controller.watcher
        loaded, last = watcher.current, watcher.last_reload
        rejected = ""
        if last is not None and not last.ok:
            why = last.error.render().splitlines()[0] if last.error is not None else last.message
            rejected = f"; the file on disk is rejected: {why}"
        if loaded is None:
            return Check("policy", False, f"no valid policy loaded from {watcher.display_name}{rejected}")
        return Check("policy", True, f"{watcher.display_name} revision {loaded.revision} "
                                     f"(sha256 {loaded.sha256[:12]}) in force{rejected}")

    def _ledger(self) -> Check:
        ledger = self.controller.ledger
        problem = ledger_directory_problem(ledger.path, ledger.access)
        return Check("ledger", problem is None, problem or f"{ledger.path} usable")

    def _figures(self) -> Check:
        sampler = self.controller.sampler
        if sampler is None:
            return Check("gpu_figures", False,
                         "no source of GPU figures (NVML, --gpu-capacity, --facts): validating only, publishing nothing")
        observing = "; observing, not publishing (--observe)" if self.controller.config.observe else ""
        return Check("gpu_figures", True, f"from {sampler.description}{observing}")
