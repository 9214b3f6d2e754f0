"""The engines' port to the ledger: one ``EngineSession`` per engine process and GPU.

Both engine adapters talk to the ledger through this module alone::

    identity = EngineIdentity(instance_id="qwen@host/0", model="qwen3-8b", engine="vllm",
                              engine_id="qwen@host", rank=0, gpu="cuda:0")
    with EngineSession.open(identity, measure=measure) as session:
        session.admit_static(40 * GiB)                 # the runtime-owned reserve, at engine start
        session.report_pools({"kv": PoolFacts(...)})   # once the real pools exist

A tensor-parallel engine's ranks admit together, all or none (``group``: the rank's place
and the engine's all-gather, see ``kvpolicy.runtime.group``)::

    session.admit_static_group(40 * GiB, RankGroup(rank, size, gather))
        pool = BlockPool(..., limit=session.limit_source())   # an elastic pool

What only the engine knows comes from its adapter: who the process is
(``EngineIdentity``) and, through ``measure``, its device's capacity and memory in
use with the policy's headroom for the GPU (``MeasuredGpu``). Which figures count
is decided here (docs/ledger.md, "Before the controller"): the controller's
published ones when there are any; before that the engine's own, offered as
provisional figures — the most cautious of all engines' wins — with as other use
what the device has in use beyond what the ledger accounts for.

Errors are the ledger's: a refusal is ``AdmissionRefused`` with every figure in its
message and ``.figures``; anything else that keeps the ledger from being used is a
``LedgerError``. Each adapter turns them into its start-up failure, once, at its edge.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvpolicy.alloc.limits import LimitReading, LimitSource
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.client import Instance, attach, resolve_access, resolve_ledger_dir
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.group import Gather, GroupAdmission, GroupAdmissionFailed, GroupRefused, RankGroup
from kvpolicy.runtime.ledger import GpuLedger
from kvpolicy.runtime.values import SlotView


@dataclass(frozen=True)
class EngineIdentity:
    """Who one engine process on one GPU is in the ledger (each adapter maps its engine's ranks to it)."""

    instance_id: str
    """Unique in the ledger, e.g. ``<engine id>/<rank>``."""
    model: str
    """The policy's name for the model."""
    engine: str
    """``sglang``, ``vllm``, … (``kvpolicy.engines``)."""
    engine_id: str
    """Shared by the ranks of one engine (tensor parallel)."""
    rank: int
    gpu: str
    """The ledger's id of the GPU (``kvpolicy.runtime.gpus``)."""


@dataclass(frozen=True)
class MeasuredGpu:
    """An engine's own figures for its GPU, offered while no controller has published."""

    capacity: int
    """The device's total memory (cuMemGetInfo), or the policy's ``capacity`` for the GPU."""
    headroom: int
    """The policy's headroom for the GPU, in bytes."""
    in_use: int
    """Memory the device has in use now, the ledger's own instances included."""


GpuMeasure = Callable[[str], MeasuredGpu | None]
"""The adapter's measurement of a GPU (by ledger id); None where this process cannot measure it."""


class EngineSession:
    """One engine process on one GPU, attached to the ledger; ``open`` makes one, ``close`` ends it."""

    def __init__(self, identity: EngineIdentity, instance: Instance, measure: GpuMeasure | None = None) -> None:
        self.identity = identity
        self._instance = instance
        self._measure = measure

    @classmethod
    def open(
        cls,
        identity: EngineIdentity,
        *,
        measure: GpuMeasure | None = None,
        guarantee: int = 0,
        elastic: bool = False,
        ledger_dir: str | os.PathLike[str] | None = None,
        handle_signals: bool = True,
    ) -> EngineSession:
        """Attach ``identity`` (an elastic instance owed ``guarantee`` if ``elastic``); LedgerError if it cannot."""
        instance = attach(
            model=identity.model,
            gpu=identity.gpu,
            engine=identity.engine,
            rank=identity.rank,
            id=identity.instance_id,
            engine_id=identity.engine_id,
            guarantee=guarantee,
            elastic=elastic,
            ledger_dir=ledger_dir,
            handle_signals=handle_signals,
        )
        return cls(identity, instance, measure)

    @property
    def gpu(self) -> str:
        return self.identity.gpu

    @property
    def closed(self) -> bool:
        return not self._instance.attached

    def wait_for_figures(self, timeout: float, poll: float = 0.2, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Wait up to ``timeout`` seconds until admission has figures for the GPU: published or
        provisional ones in the ledger, or this engine's own (``measure``). True if it has them.

        For an engine the controller has not seen yet: the controller publishes figures for a
        GPU once its ledger exists, which this session's ``open`` just created.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self._instance.gpu_figures().source != "none":
                return True
            if self._measure is not None and self._measure(self._instance.gpu) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            sleep(poll)

    def admit_static(self, nbytes: int) -> int:
        """Admit ``nbytes`` of runtime-owned memory (replacing this instance's earlier admission).

        Returns the bytes admitted, or raises ``AdmissionRefused`` with every figure. Until a
        controller publishes, the GPU's figures are the engine's (``measure``), kept as provisional.
        """
        inst = self._instance
        offered: dict[str, Any] = {}
        if self._measure is not None and inst.gpu_figures().source != "published":
            measured = self._measure(inst.gpu)
            if measured is not None:
                accounted = sum(v.accounted for v in inst.gpu_instances())
                offered = {
                    "capacity": measured.capacity,
                    "headroom": measured.headroom,
                    "other_used": max(0, measured.in_use - accounted),
                }
        return inst.admit_static(nbytes, reserve=nbytes, **offered)

    def withdraw_static(self) -> None:
        """Give back the static admission (reported pools stay counted); never refused."""
        self._instance.withdraw_static()

    def admit_static_group(self, nbytes: int, group: RankGroup | None) -> int:
        """Admit ``nbytes`` on this rank's GPU only if every rank of the engine is admitted on its own
        (``GroupAdmission``: all or none, crash-safe). ``group`` is this rank's place among the engine's
        ranks and their collective; None, or a group of one, is ``admit_static``."""
        if group is None or group.size == 1:
            return self.admit_static(nbytes)
        admission = GroupAdmission(self, rank=group.rank, size=group.size, gather=group.gather,
                                   engine=self.identity.engine_id)
        return admission.admit(nbytes)

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        """The real pools exist: their runtime-owned bytes replace the admission in the GPU's reservations."""
        self._instance.report_pools(pools)

    def limit_source(self) -> LimitSource:
        """This instance as an elastic pool's ``LimitSource`` (the slot is marked as having one)."""
        return self._instance.limit_source()

    def limits(self) -> LimitReading:
        """The limit, target, guarantee and revision in force (the guarantee alone until a controller publishes)."""
        return self._instance.read()

    def snapshot(self) -> SlotView:
        """This instance's slot as the controller and ``kvpolicy status`` read it."""
        return self._instance.snapshot()

    def touch(self) -> None:
        """The engine served something now (facts: ``idle_seconds``)."""
        self._instance.touch()

    def close(self) -> None:
        """Leave the ledger: the reservations and elastic bytes go back to the GPU. Idempotent."""
        self._instance.detach()

    def __enter__(self) -> EngineSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<kvpolicy EngineSession {self.identity.instance_id!r} on {self.gpu} ({state})>"


def ledger_capacity(gpu: str, ledger_dir: str | os.PathLike[str] | None = None) -> int | None:
    """The capacity the ledger holds for ``gpu`` (published, or an engine's provisional one), without
    attaching; None while it holds no figures, or when there is no readable segment for the GPU."""
    try:
        ledger = GpuLedger.open(resolve_ledger_dir(ledger_dir), gpu, resolve_access(), create=False)
    except (LedgerError, OSError):
        return None
    try:
        figures = ledger.figures()
    finally:
        ledger.close()
    return figures.capacity if figures.known else None


__all__ = [
    "EngineIdentity",
    "EngineSession",
    "Gather",
    "GpuMeasure",
    "GroupAdmission",
    "GroupAdmissionFailed",
    "GroupRefused",
    "MeasuredGpu",
    "RankGroup",
    "ledger_capacity",
]
