"""Who a process is, in terms that survive pid reuse: pid, start time, pid namespace.

A slot records its owner's pid, the process start time from ``/proc/<pid>/stat``
(clock ticks after boot) and the inode of its pid namespace. A pid alone is not an
identity: after the owner dies the kernel may hand the pid to another process, but
never with the same start time. Engines in other containers live in other pid
namespaces, where their pid means nothing to us; for them only the slot's lock
(see ``segment``) tells whether the owner lives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int
    """Field 22 of /proc/<pid>/stat; 0 when it cannot be read."""
    pidns: int
    """Inode of /proc/<pid>/ns/pid; 0 when it cannot be read."""


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks after boot; None if no such (live) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    rest = stat[stat.rindex(b")") + 2 :].split()
    state = rest[0]
    if state in (b"Z", b"X", b"x"):  # exited: its files, locks and memory are gone
        return None
    return int(rest[19])


def pid_namespace(pid: int | str = "self") -> int:
    """Inode of the pid namespace of ``pid`` (0 if unreadable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


def this_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(pid=pid, start_time=start_time(pid) or 0, pidns=pid_namespace())


def is_alive(pid: int, recorded_start: int) -> bool:
    """Whether the process ``pid`` that started at ``recorded_start`` still runs (our pid namespace)."""
    if pid <= 0:
        return False
    now = start_time(pid)
    return now is not None and (recorded_start == 0 or now == recorded_start)
