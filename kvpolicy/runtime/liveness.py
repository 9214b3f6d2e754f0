"""Who a process is, in terms that survive pid reuse: pid, start time, pid namespace.

A slot records its owner's pid, the process start time from ``/proc/<pid>/stat``
(clock ticks after boot) and the inode of its pid namespace. A pid alone is not an
identity: after the owner dies the kernel may hand the pid to another process, but
never with the same start time. Engines in other containers live in other pid
namespaces, where their pid means nothing to us; for them only the slot's lock
(see ``segment``) tells whether the owner lives.

``SlotOwners`` puts the two together for the slots of one segment: the owner locks
this process holds, and whether another slot's owner still lives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpolicy.runtime.segment import Segment
    from kvpolicy.runtime.values import SlotView


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


class SlotOwners:
    """Who holds the slots of one segment: the owner locks taken through it, and everyone else's."""

    __slots__ = ("_held", "_proc_readable", "_seg")

    def __init__(self, segment: Segment) -> None:
        self._seg = segment
        self._held: set[int] = set()  # slots whose owner lock this descriptor holds
        self._proc_readable = os.path.exists("/proc/self/stat")

    def holds(self, index: int) -> bool:
        """Whether this open segment holds slot ``index``'s owner lock."""
        return index in self._held

    def take(self, index: int) -> bool:
        """Take slot ``index``'s owner lock; False if a live owner elsewhere holds it."""
        if not self._seg.try_hold_slot(index):
            return False
        self._held.add(index)
        return True

    def drop(self, index: int) -> None:
        """Give slot ``index``'s owner lock back (after the slot was freed)."""
        self._held.discard(index)
        self._seg.drop_slot(index)

    def held_anywhere(self, index: int) -> bool:
        """Whether anyone — this open segment or another — holds slot ``index``'s owner lock."""
        return index in self._held or self._seg.slot_held_elsewhere(index)

    def alive(self, view: SlotView) -> bool:
        """Whether the slot's owner lives: it holds the slot lock and (same pid namespace) its pid and start time match."""
        if view.index in self._held:
            return True
        if not self._seg.slot_held_elsewhere(view.index):
            return False
        if self._proc_readable and view.pidns and view.pidns == pid_namespace():
            return is_alive(view.pid, view.start_time)
        return True
