"""The engine's side of the ledger: ``attach()`` and the ``Instance`` it returns.

An engine process attaches once per GPU it uses::

    inst = kvpolicy.attach(model="qwen3-8b", engine="vllm", gpu="cuda:0", rank=0)
    inst.admit_static(40 * GiB, reserve=40 * GiB, capacity=total, headroom=h)  # runtime-owned pools
    inst.report_pools({"kv": PoolFacts(bytes=...)})                         # once they exist
    pool = BlockPool(..., limit=inst.limit_source())                         # elastic pools

The engine adapters use it through ``session.EngineSession``, which adds the engine's
own GPU figures before a controller publishes. ``Instance`` implements
``kvpolicy.alloc.limits.LimitSource``. ``read()`` is the hot
path: one 8-byte load of the published record's sequence word and, while it has
not moved, the same ``LimitReading`` object as last time (no allocation, no lock).

Exit: ``detach()`` (or leaving the ``with`` block) frees the slot; at interpreter
exit every instance still attached detaches; SIGTERM, if the process left it at its
default, detaches and then dies of the signal as it would have; SIGINT raises
KeyboardInterrupt as usual and the exit detaches. A process that dies any other way
(kill -9, a crash) drops its slot lock with its files, and the controller's next
tick or the next ``attach`` on that GPU reclaims the slot.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpolicy.alloc.limits import AckStatus, LimitReading
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.admission import Refusal
from kvpolicy.runtime.errors import Detached, LedgerError
from kvpolicy.runtime.gpu_identity import index_id_of, is_uuid
from kvpolicy.runtime.layout import DEFAULT_SLOTS
from kvpolicy.runtime.ledger import Claim, GpuLedger
from kvpolicy.runtime.records import Words
from kvpolicy.runtime.segment import Access, add_unlock_hook, holds_any_lock, list_gpus, refuse_older_in_use
from kvpolicy.runtime.values import GpuFigures, SlotView

ENV_LEDGER_DIR = "KVPOLICY_LEDGER_DIR"
ENV_LEDGER_GROUP = "KVPOLICY_LEDGER_GROUP"
ENV_ALLOW_FOREIGN_OWNER = "KVPOLICY_LEDGER_ALLOW_FOREIGN_OWNER"
DEFAULT_LEDGER_DIR = Path("/dev/shm/kvpolicy")
ASK_AGAIN_AFTER = 8
"""``Instance.certain_refusal`` answers at most this many refusals in a row before the ledger is asked again."""


def resolve_ledger_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``$KVPOLICY_LEDGER_DIR``, else ``/dev/shm/kvpolicy``."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get(ENV_LEDGER_DIR) or DEFAULT_LEDGER_DIR)


def resolve_access(group: str | int | None = None, allow_foreign_owner: bool | None = None) -> Access:
    """Access options, each from the argument or else the environment (KVPOLICY_LEDGER_GROUP, …_ALLOW_FOREIGN_OWNER)."""
    if group is None:
        group = os.environ.get(ENV_LEDGER_GROUP) or None
    if allow_foreign_owner is None:
        flag = os.environ.get(ENV_ALLOW_FOREIGN_OWNER, "").strip().lower()
        if flag not in ("", "0", "1", "true", "false", "yes", "no"):
            raise LedgerError(f"kvpolicy ledger: {ENV_ALLOW_FOREIGN_OWNER}={flag!r}: expected 1 or 0")
        allow_foreign_owner = flag in ("1", "true", "yes")
    return Access.from_options(group, allow_foreign_owner)


class _DetachedWords:
    """Stands in for the mapping after detach, so the hot path needs no check of its own."""

    def __init__(self, inst_id: str, gpu: str) -> None:
        self._what = f"kvpolicy ledger: instance {inst_id!r} on {gpu} is detached; attach again"

    def __getitem__(self, index: int) -> int:
        raise Detached(self._what)


class Instance:
    """One engine process on one GPU, attached to the ledger. Thread-safe."""

    def __init__(self, ledger: GpuLedger, claim: Claim, *, id: str, model: str, engine: str, rank: int) -> None:
        self._ledger = ledger
        self._claim = claim
        self.id = id
        self.model = model
        self.engine = engine
        self.gpu = ledger.gpu
        self.rank = rank
        self.pid = os.getpid()
        self.last_refusal: Refusal | None = None
        """Why the last elastic admission said no (None after one that said yes)."""
        self._refused: tuple[tuple[int, tuple[int, int]], Refusal] | None = None
        """The last budget refusal, with the published record's and the GPU's sequence words read before it."""
        self._answered = 0  # refusals certain_refusal answered since the ledger was last asked
        self._attached = True
        self._words: Words = ledger.seg.words
        self._pub = ledger.records.slots[claim.index].published
        self._pub_seq_index = self._pub.seq_index
        self._pub_seen = -1
        self._reading = LimitReading(0, 0, 0)
        self._refresh()

    @property
    def slot(self) -> int:
        return self._claim.index

    @property
    def attached(self) -> bool:
        return self._attached

    # --- LimitSource -----------------------------------------------------------------------------

    def read(self) -> LimitReading:
        """The limit, target and revision in force: one 8-byte load while nothing was published."""
        if self._words[self._pub_seq_index] == self._pub_seen:
            return self._reading
        return self._refresh()

    def _refresh(self) -> LimitReading:
        seq, pub = self._pub.read(self._ledger.seg.mm, self._words)
        if pub.epoch != self._claim.epoch:
            raise Detached(f"kvpolicy ledger: instance {self.id!r} lost its slot on {self.gpu}; attach again")
        reading = LimitReading(limit=pub.limit, target=pub.target, revision=pub.revision, guarantee=pub.guarantee)
        self._reading, self._pub_seen = reading, seq
        return reading

    def admit(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` before mapping them; False (and ``last_refusal`` says why) if the limit or budget says no."""
        self._ledger.touch(self._claim.index)
        # Read before the decision: a remembered refusal then holds only while its state is the one decided on.
        seen = (self._words[self._pub_seq_index], self._ledger.budget_stamp())
        refusal = self._ledger.admit_elastic(self._claim, nbytes)
        self.last_refusal = refusal
        self._refused = (seen, refusal) if refusal is not None and refusal.reason == "budget" else None
        self._answered = 0
        return refusal is None

    def certain_refusal(self, nbytes: int) -> bool:
        """Whether the GPU's budget refuses ``nbytes`` for certain, without the ledger's lock: the last
        admission was refused for the budget, ``nbytes`` would be too, and neither the GPU's figures
        and totals nor this instance's published limits have changed since (three 8-byte reads).

        Each ``ASK_AGAIN_AFTER``-th such refusal is left to ``admit`` instead, which moves the GPU's
        pressure counter again: pools that freed blocks since (which changes no total) hear that
        someone still waits for memory.
        """
        memo = self._refused
        if memo is None:
            return False
        seen, refusal = memo
        if (self._words[self._pub_seq_index], self._ledger.budget_stamp()) != seen:
            self._refused = None
            return False
        if refusal.gpu_committed + nbytes <= refusal.budget:
            return False  # a smaller growth than the one refused may fit
        self._answered += 1
        return self._answered < ASK_AGAIN_AFTER

    def commit(self, nbytes: int) -> None:
        """The admitted bytes are mapped."""
        self._ledger.settle_elastic(self._claim, commit=nbytes)

    def rollback(self, nbytes: int) -> None:
        """The admitted bytes were not mapped: the reservation goes back."""
        self._ledger.settle_elastic(self._claim, rollback=nbytes)

    def release(self, nbytes: int) -> None:
        """``nbytes`` of mapped memory were unmapped."""
        self._ledger.settle_elastic(self._claim, release=nbytes)

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        """Bytes in live blocks (facts: ``elastic.used``) and bytes refused to waiting work (``elastic.waiting``).
        ``mapped`` is the ledger's own count, kept by commit and release, because admission must count
        exactly what it let through; the argument is accepted for the LimitSource interface."""
        self._ledger.report_usage(self._claim, used, waiting)

    def acknowledge(self, revision: int, status: AckStatus) -> None:
        """The pool applied ``revision``, or defers it while usage is above a lowered limit."""
        self._ledger.acknowledge(self._claim, revision, status)

    def pressure(self) -> int:
        """Elastic admissions the GPU's budget refused so far, any instance's (one 8-byte read)."""
        return self._ledger.pressure()

    def limit_source(self) -> Instance:
        """This instance as the elastic allocator's LimitSource; marks the slot as having an elastic pool."""
        self._claim = self._ledger.set_elastic(self._claim)
        return self

    # --- runtime-owned pools ---------------------------------------------------------------------

    def admit_static(
        self,
        nbytes: int,
        *,
        reserve: int | None = None,
        capacity: int | None = None,
        headroom: int | None = None,
        other_used: int | None = None,
    ) -> int:
        """Atomically admit a runtime-owned reservation (≤ ``reserve``) against the GPU's unreserved memory.

        Returns the bytes admitted, or raises AdmissionRefused with every figure. The GPU's C, H, U are
        the controller's published ones; before any publish, ``capacity`` (measured, e.g. cuMemGetInfo's
        total), ``headroom`` (the policy's) and ``other_used`` are used and kept as provisional figures.
        """
        return self._ledger.admit_static(
            self._claim, nbytes, reserve=reserve, capacity=capacity, headroom=headroom, other_used=other_used
        )

    def withdraw_static(self) -> None:
        """Give back the static admission (reported pools stay counted). Never refused."""
        self._ledger.withdraw_static(self._claim)

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        """The real pools: their runtime-owned bytes replace the admitted figure in the GPU's R."""
        self._ledger.report_pools(self._claim, pools)

    # --- the rest --------------------------------------------------------------------------------

    def touch(self) -> None:
        """The instance served something now (facts: ``idle_seconds``). One store, no lock."""
        self._ledger.touch(self._claim.index)

    def gpu_figures(self) -> GpuFigures:
        """The GPU's figures as the ledger holds them: published, provisional (engines' own) or none yet."""
        return self._ledger.figures()

    def gpu_instances(self) -> list[SlotView]:
        """Every instance attached on this GPU, this one included (slots that fail their checks are left out)."""
        views, _ = self._ledger.slots()
        return views

    def snapshot(self) -> SlotView:
        """The slot as others read it."""
        view = self._ledger.slot(self._claim.index)
        if view is None or view.epoch != self._claim.epoch:
            raise Detached(f"kvpolicy ledger: instance {self.id!r} no longer holds its slot on {self.gpu}")
        return view

    def detach(self) -> None:
        """Free the slot (reservations and elastic bytes go back to the GPU). Idempotent."""
        if not self._attached:
            return
        _registry.pop(id(self), None)
        if os.getpid() != self.pid:  # a fork's copy: the slot belongs to the parent
            self._attached = False
            return
        try:
            self._ledger.free(self._claim)
        finally:
            self._attached = False
            self._words = _DetachedWords(self.id, self.gpu)  # read() now says why instead of reading freed memory
            self._ledger.close()

    def __enter__(self) -> Instance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self._attached else "detached"
        return f"<kvpolicy Instance {self.id!r} on {self.gpu} slot {self._claim.index} ({state})>"


def attach(
    *,
    model: str,
    gpu: str,
    engine: str = "any",
    rank: int = 0,
    id: str | None = None,
    engine_id: str | None = None,
    guarantee: int = 0,
    elastic: bool = False,
    capacity: int | None = None,
    headroom: int | None = None,
    other_used: int | None = None,
    ledger_dir: str | os.PathLike[str] | None = None,
    group: str | int | None = None,
    allow_foreign_owner: bool | None = None,
    slots: int = DEFAULT_SLOTS,
    handle_signals: bool = True,
) -> Instance:
    """Register this process as an instance of ``model`` on ``gpu`` and return its handle.

    ``id`` defaults to ``model/rank`` and must be unique in the ledger. ``guarantee`` is the
    elastic minimum this instance is owed (from the policy, or 0): its limit until the controller
    publishes. ``capacity``/``headroom``/``other_used``, if given, become the GPU's provisional
    figures until a controller publishes (see ``Instance.admit_static``). Dead instances on the
    GPU are reclaimed first.
    """
    directory = resolve_ledger_dir(ledger_dir)
    access = resolve_access(group, allow_foreign_owner)
    inst_id = id if id is not None else f"{model}/{rank}"
    others = _ids_on_other_gpus(directory, gpu, access)
    if is_uuid(gpu) and (index_id := index_id_of(gpu)) is not None:
        refuse_older_in_use(directory, index_id)  # an engine of layout 2 keys this GPU by its index
    ledger = GpuLedger.open(directory, gpu, access, slot_count=slots, repair=True)
    try:
        claim = ledger.claim(
            id=inst_id,
            model=model,
            engine=engine,
            engine_id=engine_id,
            rank=rank,
            guarantee=guarantee,
            elastic=elastic,
            other_ids=others,
        )
        if capacity is not None:
            ledger.provide_figures(capacity=capacity, headroom=headroom, other_used=other_used)
    except BaseException:
        ledger.close()
        raise
    inst = Instance(ledger, claim, id=inst_id, model=model, engine=engine, rank=rank)
    _registry[id_of(inst)] = inst
    _install_exit_handlers(handle_signals)
    return inst


def id_of(obj: object) -> int:
    return id(obj)


def _ids_on_other_gpus(directory: Path, gpu: str, access: Access) -> frozenset[str]:
    """Ids of live instances on the ledger's other GPUs (best effort: unreadable segments are skipped)."""
    ids: set[str] = set()
    for other in list_gpus(directory):
        if other == gpu:
            continue
        try:
            led = GpuLedger.open(directory, other, access, create=False)
        except (LedgerError, OSError):
            continue  # its own users will hear about it; uniqueness is checked where it can be
        try:
            views, _ = led.slots()
            ids.update(v.id for v in views if led.owner_alive(v))
        finally:
            led.close()
    return frozenset(ids)


# --- exit handling ---------------------------------------------------------------------------------

_registry: dict[int, Instance] = {}
_handlers_lock = threading.Lock()
_atexit_installed = False
_sigterm_installed = False
_deferred_signal: int | None = None


def detach_all() -> None:
    """Detach every instance this process attached (atexit and signal handlers call it)."""
    for inst in list(_registry.values()):
        if inst.pid == os.getpid():
            inst.detach()
        else:
            _registry.pop(id(inst), None)


def _install_exit_handlers(handle_signals: bool) -> None:
    global _atexit_installed, _sigterm_installed
    with _handlers_lock:
        if not _atexit_installed:
            _atexit_installed = True
            atexit.register(detach_all)
            add_unlock_hook(_run_deferred_signal)
        if (
            handle_signals
            and not _sigterm_installed
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            _sigterm_installed = True
            signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _deferred_signal
    if holds_any_lock():  # interrupted inside a ledger change: finish it first
        _deferred_signal = signum
        return
    _die_of(signum)


def _run_deferred_signal() -> None:
    global _deferred_signal
    if _deferred_signal is not None and threading.current_thread() is threading.main_thread():
        signum, _deferred_signal = _deferred_signal, None
        _die_of(signum)


def _die_of(signum: int) -> None:
    """Detach, then die of the signal as the default disposition would have."""
    try:
        detach_all()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
