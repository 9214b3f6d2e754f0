"""In-process stand-ins for the shared-memory ledger, for tests of an adapter's own logic.

- ``InProcessLedger``: engine sessions (``kvpolicy.runtime.session.EngineSession``'s
  ``admit_static``, ``report_pools``, ``close``) for the GPUs of one process. Its
  ``session`` takes any identity with ``gpu`` and ``instance_id`` (an
  ``EngineIdentity``, SGLang's ``InstanceIdentity``), so it is an SGLang ``Connector``.
- ``InProcessVllmLedger``: the vLLM adapter's ``VllmLedger`` (admissions and reports
  by rank, ``InstanceKey``), for ``set_static_ledger``.

Both refuse as the real ledger does, with the runtime's ``AdmissionRefused`` and its
figures, and are thread-safe: admissions are all-or-nothing under races.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from kvpolicy.adapters.vllm_adapter.identity import InstanceKey
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.errors import AdmissionRefused, LedgerError
from kvpolicy.units import format_bytes


class Identified(Protocol):
    @property
    def gpu(self) -> str: ...

    @property
    def instance_id(self) -> str: ...


class InProcessLedger:
    """Static admission and pool reports for the GPUs of one process.

    ``unreserved`` is, per GPU, the GPU's unreserved memory (C − H − U − R − G, docs/ledger.md)
    before anything is admitted here. Invariant, under the lock: ``admitted[gpu] + reported[gpu]
    ≤ unreserved[gpu]`` is checked at every admission, and each instance holds either an
    admission or a report.
    """

    def __init__(self, unreserved: Mapping[str, int]) -> None:
        self.lock = threading.Lock()
        self.unreserved = dict(unreserved)
        self.admitted: dict[str, dict[str, int]] = {gpu: {} for gpu in unreserved}
        self.reports: dict[str, dict[str, dict[str, PoolFacts]]] = {gpu: {} for gpu in unreserved}

    def held(self, gpu: str) -> int:
        """Bytes admitted or reported on ``gpu``."""
        reported = sum(sum(p.bytes for p in pools.values()) for pools in self.reports[gpu].values())
        return sum(self.admitted[gpu].values()) + reported

    def session(self, identity: Identified) -> InProcessSession:
        if identity.gpu not in self.unreserved:
            known = ", ".join(sorted(self.unreserved)) or "none"
            raise LedgerError(f"kvpolicy: GPU {identity.gpu!r} is not in the ledger (known: {known})")
        return InProcessSession(self, identity.gpu, identity.instance_id)


class InProcessSession:
    """One instance's session in an ``InProcessLedger``."""

    def __init__(self, ledger: InProcessLedger, gpu: str, instance_id: str) -> None:
        self.ledger, self.gpu, self.instance_id = ledger, gpu, instance_id

    def admit_static(self, nbytes: int) -> int:
        ledger, gpu, key = self.ledger, self.gpu, self.instance_id
        with ledger.lock:
            others = ledger.held(gpu) - ledger.admitted[gpu].get(key, 0)
            free = ledger.unreserved[gpu] - others
            if nbytes > free:
                raise AdmissionRefused(
                    f"kvpolicy: cannot admit {format_bytes(nbytes)} ({nbytes} B) for {key} on {gpu}: "
                    f"{format_bytes(max(free, 0))} ({free} B) of the GPU's "
                    f"{format_bytes(ledger.unreserved[gpu])} unreserved memory is left "
                    f"({format_bytes(others)} held by other instances)",
                    {"asked": nbytes, "unreserved": ledger.unreserved[gpu], "reserved_by_others": others, "free": free},
                )
            ledger.admitted[gpu][key] = nbytes
            return nbytes

    def admit_static_group(self, nbytes: int, group: object) -> int:
        """A group of one is ``admit_static``; ranks in other processes need the real ledger."""
        if group is None or getattr(group, "size", 1) == 1:
            return self.admit_static(nbytes)
        raise LedgerError("kvpolicy: the in-process ledger holds one process; a tensor-parallel group needs the real one")

    def report_pools(self, pools: Mapping[str, PoolFacts]) -> None:
        ledger, gpu, key = self.ledger, self.gpu, self.instance_id
        with ledger.lock:
            ledger.admitted[gpu].pop(key, None)  # the real bytes replace the admission
            ledger.reports[gpu][key] = dict(pools)

    def close(self) -> None:
        with self.ledger.lock:
            self.ledger.admitted[self.gpu].pop(self.instance_id, None)
            self.ledger.reports[self.gpu].pop(self.instance_id, None)


class InProcessVllmLedger:
    """The vLLM adapter's ``VllmLedger`` for GPUs of known unreserved memory, inside one process.

    ``unreserved`` is per GPU what admission may hand out (for the real ledger:
    C − H − U − R − G). Each rank holds at most one admission; reports are kept by rank.
    """

    def __init__(self, unreserved: Mapping[str, int]) -> None:
        self.lock = threading.Lock()
        self._unreserved = dict(unreserved)
        self.admitted: dict[InstanceKey, tuple[str, int]] = {}
        self.reports: dict[InstanceKey, dict[str, PoolFacts]] = {}

    def admit(self, instance: InstanceKey, gpu: str, nbytes: int, group: object = None) -> int:
        """One process's ranks: ``group`` (the engine's ranks) is accepted and not used here."""
        if nbytes <= 0:
            raise AdmissionRefused(f"kvpolicy: {instance.id}: cannot admit {nbytes} bytes (must be > 0)", {"asked": nbytes})
        with self.lock:
            if instance in self.admitted:
                raise AdmissionRefused(f"kvpolicy: {instance.id} already holds an admission on {gpu}", {"asked": nbytes})
            if gpu not in self._unreserved:
                known = ", ".join(sorted(self._unreserved)) or "none"
                raise AdmissionRefused(f"kvpolicy: GPU {gpu!r} is not in the ledger (known: {known})", {"asked": nbytes})
            free = self._unreserved[gpu]
            if nbytes > free:
                raise AdmissionRefused(
                    f"kvpolicy: cannot reserve {format_bytes(nbytes)} ({nbytes} B) of KV cache for "
                    f"{instance.id} on {gpu}: only {format_bytes(free)} ({free} B) is unreserved. "
                    "Lower the model's `reserve` in the policy, or free memory on that GPU.",
                    {"asked": nbytes, "unreserved": free},
                )
            self._unreserved[gpu] = free - nbytes
            self.admitted[instance] = (gpu, nbytes)
            return nbytes

    def release(self, instance: InstanceKey) -> None:
        """The instance stopped: its admission returns to its GPU."""
        with self.lock:
            gpu, nbytes = self.admitted.pop(instance)
            self._unreserved[gpu] += nbytes
            self.reports.pop(instance, None)

    def unreserved(self, gpu: str) -> int:
        with self.lock:
            return self._unreserved[gpu]

    def report_pools(self, instance: InstanceKey, pools: Mapping[str, PoolFacts]) -> None:
        with self.lock:
            self.reports[instance] = dict(pools)
