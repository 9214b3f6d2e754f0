"""What the vLLM adapter needs from the ledger for a runtime-owned KV cache, as two small protocols.

- ``StaticAdmission.admit``: at engine start, each worker reserves its KV budget on
  its GPU, atomically across processes, before vLLM sizes the cache from it.
- ``PoolReporter.report_pools``: each rank reports its pools (``reports``).

``static_ledger()`` is this process's ledger: the shared-memory ledger client
(``kvpolicy.runtime``) under ``KVPOLICY_LEDGER_DIR``, connected on first use, unless
``set_static_ledger`` gave another. ``InProcessLedger`` implements both protocols
inside one process (tests, single-engine tools).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import ENV_ENABLE, AdapterEnv
from kvpolicy.facts import PoolFacts
from kvpolicy.units import format_bytes

from ..identity import InstanceKey


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
    """Both halves; what ``static_ledger`` returns."""


_ledger: VllmLedger | None = None


def set_static_ledger(ledger: VllmLedger | None) -> None:
    """Use ``ledger`` for admission and reports in this process (None: back to ``connect_ledger``)."""
    global _ledger
    _ledger = ledger


def connect_ledger(env: AdapterEnv) -> VllmLedger:
    """The shared-memory ledger under ``env.ledger_dir``, through its client."""
    try:
        from kvpolicy.runtime.engines import connect_vllm_ledger
    except ImportError:
        raise AdapterError(
            f"kvpolicy: no ledger client in this install (kvpolicy.runtime.engines), so the KV budget "
            f"cannot be admitted on the GPU ({env.ledger_dir}). Update kvpolicy, or unset {ENV_ENABLE}."
        ) from None
    return connect_vllm_ledger(env)


def static_ledger() -> VllmLedger:
    """This process's ledger for static admission and pool reports."""
    global _ledger
    if _ledger is None:
        _ledger = connect_ledger(AdapterEnv.from_environ())
    return _ledger


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
