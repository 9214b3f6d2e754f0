"""What the vLLM adapter needs from the ledger, as two small protocols.

- ``StaticAdmission.admit``: at engine start, each worker reserves its KV budget on
  its GPU, atomically across processes, before vLLM sizes the cache from it.
- ``PoolReporter.report_pools``: the engine core reports each rank's pools.

``InProcessLedger`` implements both inside one process (tests, single-engine
tools). The shared-memory ledger client (``kvpolicy.runtime``) plugs in through
``plugin.set_ledger`` / ``connect_ledger`` without changes here.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvpolicy.adapters.common import AdapterError

from kvpolicy.facts import PoolFacts
from kvpolicy.units import format_bytes


@dataclass(frozen=True)
class InstanceKey:
    """One engine process on one GPU: rank ``rank`` of engine ``engine_id``.

    Every rank of one vLLM engine shares ``engine_id`` (tensor/pipeline parallel
    ranks are one engine, DESIGN §4); ``dp_rank`` tells data-parallel engines apart.
    """

    engine_id: str
    model: str
    rank: int = 0
    dp_rank: int = 0

    @property
    def id(self) -> str:
        dp = f"/dp{self.dp_rank}" if self.dp_rank else ""
        return f"{self.engine_id}{dp}/{self.rank}"


class AdmissionRefused(AdapterError):
    """The ledger cannot reserve the KV budget on this GPU; the message has the figures."""


@runtime_checkable
class StaticAdmission(Protocol):
    def admit(self, instance: InstanceKey, gpu: str, nbytes: int) -> int:
        """Reserve ``nbytes`` of runtime-owned KV memory for ``instance`` on ``gpu``.

        Atomic across processes. Returns the bytes admitted (never more than asked),
        or raises AdmissionRefused saying what was asked, what is free and why.
        """
        ...


@runtime_checkable
class PoolReporter(Protocol):
    def report_pools(self, instance: InstanceKey, pools: Mapping[str, PoolFacts]) -> None:
        """Replace ``instance``'s pool facts; from then on they count instead of its admission."""
        ...


class VllmLedger(StaticAdmission, PoolReporter, Protocol):
    """Both halves; what ``connect_ledger`` returns."""


class InProcessLedger:
    """Static admission and pool reports for GPUs of known free memory, inside one process.

    ``unreserved`` is per GPU what admission may hand out (for the real ledger:
    C − H − U − R − Σ guarantees). Thread-safe; admissions are all-or-nothing.
    """

    def __init__(self, unreserved: Mapping[str, int]) -> None:
        self._lock = threading.Lock()
        self._unreserved = dict(unreserved)
        self.admitted: dict[InstanceKey, tuple[str, int]] = {}
        self.reports: dict[InstanceKey, dict[str, PoolFacts]] = {}

    def admit(self, instance: InstanceKey, gpu: str, nbytes: int) -> int:
        if nbytes <= 0:
            raise AdmissionRefused(f"kvpolicy: {instance.id}: cannot admit {nbytes} bytes (must be > 0)")
        with self._lock:
            if instance in self.admitted:
                raise AdmissionRefused(f"kvpolicy: {instance.id} already holds an admission on {gpu}")
            if gpu not in self._unreserved:
                known = ", ".join(sorted(self._unreserved)) or "none"
                raise AdmissionRefused(f"kvpolicy: GPU {gpu!r} is not in the ledger (known: {known})")
            free = self._unreserved[gpu]
            if nbytes > free:
                raise AdmissionRefused(
                    f"kvpolicy: cannot reserve {format_bytes(nbytes)} ({nbytes} B) of KV cache for "
                    f"{instance.id} on {gpu}: only {format_bytes(free)} ({free} B) is unreserved. "
                    "Lower the model's `reserve` in the policy, or free memory on that GPU."
                )
            self._unreserved[gpu] = free - nbytes
            self.admitted[instance] = (gpu, nbytes)
            return nbytes

    def release(self, instance: InstanceKey) -> None:
        """The instance stopped: its admission returns to its GPU."""
        with self._lock:
            gpu, nbytes = self.admitted.pop(instance)
            self._unreserved[gpu] += nbytes
            self.reports.pop(instance, None)

    def unreserved(self, gpu: str) -> int:
        with self._lock:
            return self._unreserved[gpu]

    def report_pools(self, instance: InstanceKey, pools: Mapping[str, PoolFacts]) -> None:
        with self._lock:
            self.reports[instance] = dict(pools)
