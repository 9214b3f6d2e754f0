"""The controller's side of the ledger: every GPU's segment in one directory.

The controller is meant to be a thin loop over this class::

    ledger = LedgerDir(path, create=True)
    with ledger.claim_controller():
        revision = ledger.read().revision            # a restarted controller continues from the ledger
        while True:
            ledger.reclaim_dead()                     # dead engines' slots and bytes go back
            view = ledger.read()                      # consistent slots, figures, generations
            if policy changed or view.generations != last or timer:
                decision, state = evaluate(policy, view.facts(samples), state)
                revision += 1
                ledger.publish(view, revision, gpu_limits, instance_limits)
            ledger.heartbeat()
            write_status(ledger.path, ...)
            sleep(tick)

Nothing here knows the policy or the evaluator: it reads slots as ``Facts`` and
publishes numbers keyed by instance id.

The directory itself may be removed and made again under a running controller (``rm -rf``
of the ledger, a tmpfs remounted). Its segments' files go with it, but not this process's
mappings of them: every look at the directory compares its identity (device, inode) with
the one the open segments came from (while they are open, the old directory's inode cannot
be reused), and on a change lets go of them all — closed and unmapped, logged once — and
opens what the directory at that path holds now.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kvpolicy.facts import Facts, GpuFacts, InstanceFacts
from kvpolicy.paths import reason
from kvpolicy.runtime.client import resolve_access, resolve_ledger_dir
from kvpolicy.runtime.errors import ControllerRunning, LedgerError, SegmentSetAside, SegmentTruncated
from kvpolicy.runtime.layout import DEFAULT_SLOTS
from kvpolicy.runtime.ledger import GpuLedger
from kvpolicy.runtime.liveness import this_process
from kvpolicy.runtime.segment import OTHERS_DIR, Access, check_owner, ensure_directory, list_gpus
from kvpolicy.runtime.values import GpuFigures, GpuLimits, InstanceLimits, SlotView, Totals

log = logging.getLogger("kvpolicy.ledger")
T = TypeVar("T")

CONTROLLER_LOCK = "controller.lock"
_FLOCK = struct.Struct("hhxxxxqqixxxx")


@dataclass(frozen=True)
class GpuSample:
    """What the controller measured on a GPU (NVML or cuMemGetInfo)."""

    capacity: int
    used: int | None = None
    """Bytes in use on the whole GPU; other_used = used − what the ledger accounts for."""
    other_used: int | None = None
    """Memory no instance accounts for, when it is known directly (a facts file)."""
    name: str | None = None
    """The GPU's display name (``cuda:N`` in NVML's numbering on the controller's machine), if known."""


@dataclass(frozen=True)
class GpuState:
    """One GPU's segment as read: its figures, totals, and live and dead instances."""

    gpu: str
    generation: int
    heartbeat: float | None
    figures: GpuFigures
    totals: Totals
    instances: tuple[SlotView, ...]
    dead: tuple[SlotView, ...]
    problems: tuple[str, ...]
    pressure: int = 0
    """Elastic admissions the GPU's budget refused so far (the ledger's pressure word)."""

    @property
    def accounted(self) -> int:
        """Bytes the ledger knows to be on the GPU now: reported runtime-owned pools and elastic mapped."""
        return sum(v.accounted for v in self.instances)

    @property
    def reserved_by_pool(self) -> dict[str, int]:
        by: dict[str, int] = {}
        for v in self.instances:
            for name, p in v.facts(0.0).pools.items():
                if p.owner == "runtime":
                    by[name] = by.get(name, 0) + p.bytes
        return dict(sorted(by.items()))


@dataclass(frozen=True)
class LedgerView:
    """Everything in the ledger at one moment (each GPU consistent in itself)."""

    path: Path
    now: float
    gpus: dict[str, GpuState]
    problems: tuple[str, ...] = ()
    """Notes on the directory: segments moved aside since the last read."""
    refused: dict[str, str] = field(default_factory=dict)
    """GPUs whose segment is there but cannot be used now (damaged, another layout, not the owner's),
    and why, in GPU order: their engines are out of reach, neither read nor given limits."""
    directory: tuple[int, int] | None = None
    """The identity (device, inode) of the directory the segments were read from; None when there was
    none. Another one at the next read means the directory was removed and made again."""

    @property
    def generations(self) -> dict[str, int]:
        return {g: s.generation for g, s in self.gpus.items()}

    @property
    def revision(self) -> int:
        """The highest revision published so far (0: never): a restarted controller continues above it."""
        revs = [s.figures.revision for s in self.gpus.values()]
        revs += [v.revision for s in self.gpus.values() for v in s.instances]
        return max(revs, default=0)

    @property
    def heartbeat(self) -> float | None:
        beats = [s.heartbeat for s in self.gpus.values() if s.heartbeat is not None]
        return max(beats) if beats else None

    def controller_stale(self, stale_after: float) -> bool:
        """No heartbeat within ``stale_after`` seconds (or never)."""
        hb = self.heartbeat
        return hb is None or self.now - hb > stale_after

    def instances(self) -> list[SlotView]:
        return [v for s in self.gpus.values() for v in s.instances]

    def find(self, instance_id: str) -> SlotView | None:
        return next((v for v in self.instances() if v.id == instance_id), None)

    def stuck(self, after: float) -> list[SlotView]:
        """Instances whose deferral is older than ``after`` seconds."""
        return [v for v in self.instances() if v.stuck(self.now, after)]

    def facts(self, samples: Mapping[str, GpuSample] | None = None) -> tuple[Facts, list[str]]:
        """The ledger as ``Facts`` (schema 1), and what had to be left out and why.

        A GPU's capacity comes from ``samples``, else from published or provisional figures (said in
        a note where there are samples: the source of figures does not know that GPU); a GPU with
        none is left out with its instances. ``other_used`` is ``sample.used`` minus what the
        ledger accounts for, else the figures' U.
        """
        sampled = samples is not None
        samples = samples or {}
        notes = list(self.problems) + [f"{gpu}: {why}" for gpu, why in sorted(self.refused.items())]
        gpus: list[GpuFacts] = []
        instances: list[InstanceFacts] = []
        seen: dict[str, str] = {}
        for gpu, state in sorted(self.gpus.items()):
            notes.extend(state.problems)
            sample = samples.get(gpu)
            if sample is not None:
                capacity = sample.capacity
                if sample.other_used is not None:
                    other = sample.other_used
                elif sample.used is not None:
                    other = max(0, sample.used - state.accounted)
                else:
                    other = state.figures.other_used
            elif state.figures.known:
                capacity, other = state.figures.capacity, state.figures.other_used
                if sampled:
                    notes.append(f"{gpu}: the source of GPU figures does not know it: using the figures the "
                                 f"ledger holds ({state.figures.source})")
            else:
                if state.instances:
                    notes.append(
                        f"{gpu}: left out with {len(state.instances)} instance(s): its capacity is unknown "
                        "(no sample, and no controller or engine has given figures)"
                    )
                continue
            name = sample.name if sample is not None else None
            gpus.append(GpuFacts(id=gpu, name=name, capacity=capacity, other_used=other))
            for v in state.instances:
                if v.id in seen:
                    notes.append(f"instance id {v.id!r} is attached on {seen[v.id]} and {gpu}; the one on {gpu} is left out")
                    continue
                seen[v.id] = gpu
                instances.append(v.facts(self.now))
        return Facts(now=self.now, gpus=tuple(gpus), instances=tuple(instances)), notes


class ControllerLock:
    """Held by the one controller of a ledger directory; dropped by the kernel if it dies."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor drops the OFD lock
            self.fd = None

    def still_named(self) -> bool:
        """Whether the lock file's name still leads to the file this lock is on. Removing it (or the
        whole directory) would let a second controller lock a new file of that name beside this one."""
        if self.fd is None:
            return False
        try:
            named = os.stat(self.path)
        except OSError:
            return False
        held = os.fstat(self.fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def __enter__(self) -> ControllerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LedgerDir:
    """All segments of a ledger directory, opened as they appear."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        group: str | int | None = None,
        allow_foreign_owner: bool | None = None,
        access: Access | None = None,
        create: bool = False,
    ) -> None:
        self.path = resolve_ledger_dir(path)
        self.access = access or resolve_access(group, allow_foreign_owner)
        if create:
            ensure_directory(self.path, self.access)
        elif _exists(self.path):
            check_owner(os.lstat(self.path), f"the ledger directory {self.path}", self.access, others=OTHERS_DIR)
        self._open: dict[str, GpuLedger] = {}
        self._directory = _identity(self.path)  # looked at above, or made
        """The identity of the directory the segments in ``_open`` are in (None: there is none)."""
        self._set_aside: list[str] = []
        """Segments moved aside since the last ``read()``, which reports them."""

    def _same_directory(self) -> tuple[int, int] | None:
        """The directory's identity now; if it is not the one the open segments are in (it was removed,
        or removed and made again), they are closed and unmapped first: their files are gone with it,
        and a segment of the same name in a new directory is another segment."""
        try:
            now = _identity(self.path)
        except OSError:  # cannot be told now (a directory on the way that cannot be entered): as it was
            return self._directory
        if now != self._directory:
            dropped = sorted(self._open)
            self.close()
            self._directory = now
            if dropped:
                log.warning(
                    "the ledger directory %s was removed%s: closed the %d segment(s) opened in the old one (%s) and "
                    "reads the segments at that path afresh; engines still attached to the removed segments are "
                    "out of reach (restart them to join the new directory)",
                    self.path, "" if now is None else " and made again", len(dropped), ", ".join(dropped))
        return now

    def gpus(self) -> list[str]:
        """GPU ids with a segment in the directory."""
        return list_gpus(self.path)

    def gpu(self, gpu: str, *, create: bool = False, slots: int = DEFAULT_SLOTS) -> GpuLedger:
        """The GPU's ledger (opened once and kept)."""
        led = self._open.get(gpu)
        if led is None:
            led = GpuLedger.open(self.path, gpu, self.access, create=create, slot_count=slots, repair=True)
            self._open[gpu] = led
        return led

    def _ledgers(self) -> tuple[dict[str, GpuLedger], dict[str, str]]:
        """Every GPU's open ledger, size-checked, and why each GPU that cannot be used now cannot.

        A segment that went bad since it was opened (truncated under its mapping) is closed and
        opened again, which moves it aside when nobody holds a slot in it.
        """
        self._same_directory()
        ledgers: dict[str, GpuLedger] = {}
        refused: dict[str, str] = {}
        for g in self.gpus():
            try:
                led = self._open.get(g)
                if led is not None:
                    try:
                        led.seg.check_size()
                    except SegmentTruncated:
                        self._forget(g)
                        raise
                ledgers[g] = self.gpu(g)
            except SegmentSetAside as exc:
                self._set_aside.append(f"{g}: {exc}")  # happens once: kept for the next read()
            except (LedgerError, OSError) as exc:
                refused[g] = str(exc)  # a refused or damaged segment is reported, never trusted
        return ledgers, refused

    def _forget(self, gpu: str) -> None:
        led = self._open.pop(gpu, None)
        if led is not None:
            led.close()

    def _each(self, what: str, ledgers: Mapping[str, GpuLedger], act: Callable[[GpuLedger], T]) -> dict[str, T]:
        """``act`` on each GPU's ledger; one GPU's failure is logged and the others go on."""
        done: dict[str, T] = {}
        for g, led in ledgers.items():
            try:
                done[g] = act(led)
            except (LedgerError, OSError) as exc:
                log.error("%s %s: %s", what, g, exc)
                if isinstance(exc, SegmentTruncated):
                    self._forget(g)  # opened afresh next time (moved aside if nobody holds a slot in it)
        return done

    def generations(self) -> dict[str, int]:
        """Each GPU's generation: one 8-byte read each (poll this between full reads)."""
        ledgers, _ = self._ledgers()
        return {g: led.generation() for g, led in ledgers.items()}

    def read(self, now: float | None = None) -> LedgerView:
        """Every GPU's figures, totals and instances (live ones; dead ones apart) at one moment."""
        now = time.time() if now is None else now
        ledgers, refused = self._ledgers()
        problems, self._set_aside = self._set_aside, []
        states: dict[str, GpuState] = {}
        for g, led in ledgers.items():
            try:
                generation = led.generation()
                views, slot_problems = led.slots()
                alive = [led.owner_alive(v) for v in views]
                live = tuple(v for v, a in zip(views, alive) if a)
                dead = tuple(v for v, a in zip(views, alive) if not a)
                states[g] = GpuState(
                    gpu=g,
                    generation=generation,
                    heartbeat=led.heartbeat(),
                    figures=led.figures(),
                    totals=led.totals(),
                    instances=live,
                    dead=dead,
                    problems=tuple(slot_problems),
                    pressure=led.pressure(),
                )
            except (LedgerError, OSError) as exc:
                refused[g] = str(exc)
                if isinstance(exc, SegmentTruncated):
                    self._forget(g)
        return LedgerView(path=self.path, now=now, gpus=states, problems=tuple(problems),
                          refused=dict(sorted(refused.items())), directory=self._directory)

    def reclaim_dead(self) -> list[SlotView]:
        """Free the slots of dead engines on every GPU; what was reclaimed."""
        ledgers, _ = self._ledgers()
        done = self._each("reclaiming dead engines on", ledgers, GpuLedger.reclaim_dead)
        return [v for gone in done.values() for v in gone]

    def publish(
        self,
        view: LedgerView,
        revision: int,
        gpus: Mapping[str, GpuLimits],
        instances: Mapping[str, InstanceLimits],
    ) -> list[str]:
        """Publish ``revision``: per GPU its figures and budget, per instance id its limits.

        Instances are matched to the slots ``view`` read them from; one whose slot changed hands
        since, or that the view does not know, is skipped and named in the result. Nothing is
        published when the directory was replaced since ``view`` was read: its slots are not these.
        """
        if self._same_directory() != view.directory:
            return [f"{self.path}: the ledger directory was removed or replaced since it was read; nothing published"]
        skipped: list[str] = []
        by_gpu: dict[str, dict[tuple[int, int], InstanceLimits]] = {g: {} for g in view.gpus}
        for inst_id, lim in instances.items():
            v = view.find(inst_id)
            if v is None:
                skipped.append(f"{inst_id}: not in the ledger view")
                continue
            by_gpu[v.gpu][(v.index, v.epoch)] = lim
        me = this_process()
        for g in sorted(set(by_gpu) | set(gpus)):
            if g not in view.gpus:
                skipped.append(f"{g}: no segment for this GPU")
                continue
            try:
                skipped.extend(self.gpu(g).publish(revision, gpus.get(g), by_gpu.get(g, {}), me))
            except (LedgerError, OSError) as exc:
                skipped.append(f"{g}: not published: {exc}")
                if isinstance(exc, SegmentTruncated):
                    self._forget(g)
        return skipped

    def heartbeat(self, now: float | None = None) -> None:
        """Tell engines and ``kvpolicy status`` that the controller lives."""
        ledgers, _ = self._ledgers()  # size-checked: a beat into a truncated mapping would be SIGBUS
        self._each("heartbeat on", ledgers, lambda led: led.beat(now))

    def claim_controller(self) -> ControllerLock:
        """Become the directory's one controller, or LedgerError naming the one that is."""
        ensure_directory(self.path, self.access)
        path = self.path / CONTROLLER_LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, self.access.file_mode)
        try:
            check_owner(os.fstat(fd), f"the controller lock {path}", self.access)
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise ControllerRunning(
                    f"kvpolicy ledger: another controller (pid {holder}) is running on {self.path}; "
                    "stop it first, or use another --ledger-dir",
                    holder,
                ) from None
            os.ftruncate(fd, 0)
            try:
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                raise LedgerError(
                    f"kvpolicy ledger: cannot write {path} ({errno.errorcode.get(exc.errno or 0, 'error')}: "
                    f"{exc.strerror}); free space in {self.path}'s filesystem"
                ) from None
        except BaseException:
            os.close(fd)
            raise
        return ControllerLock(fd, path)

    def controller_running(self) -> bool | None:
        """Whether a controller holds the directory's lock now; None when there is no lock file or it
        cannot be read. Unlike the heartbeat, this knows at once that a controller died."""
        try:
            fd = os.open(self.path / CONTROLLER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            probe = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
            return _FLOCK.unpack(probe)[0] != fcntl.F_UNLCK
        except OSError:
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        for led in self._open.values():
            led.close()
        self._open.clear()

    def __enter__(self) -> LedgerDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _identity(path: Path) -> tuple[int, int] | None:
    """The directory's (device, inode), None if nothing is there; OSError if that cannot be told."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; LedgerError when that cannot be told (a directory on the way that
    cannot be entered)."""
    try:
        return path.exists()
    except OSError as exc:
        raise LedgerError(f"kvpolicy ledger: cannot read {path}: {reason(exc)}") from None
