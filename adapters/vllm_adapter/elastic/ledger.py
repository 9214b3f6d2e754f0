"""What an elastic vLLM rank needs from the ledger, and the shared-memory implementation.

- ``attach(key, gpu, guarantee)``: the rank's ledger instance, marked elastic, with the
  model's ``min`` as its guarantee (its limit until a controller publishes). It is
  the allocator's ``LimitSource`` (elastic admission, commit, release, usage,
  acknowledgements), and also takes the static admission of the null block's chunks,
  the pool reports and ``touch`` (activity, for ``idle_seconds``).
- ``admit_pinned(instance, nbytes)``: the static (runtime-owned) admission of the
  pinned chunks, with the GPU's figures measured here when no controller published.
- ``capacity(gpu)``: the GPU's total memory, to resolve percentages of min/max.

``set_elastic_ledger`` swaps the implementation (tests that need no shared memory).
"""

from __future__ import annotations

from typing import Any, Protocol

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv

from ..identity import InstanceKey


class ElasticLedger(Protocol):
    def attach(self, key: InstanceKey, gpu: str, guarantee: int) -> Any:
        """The instance of rank ``key`` on ``gpu`` (a LimitSource with ``admit_static``, ``report_pools``, ``touch``)."""
        ...

    def admit_pinned(self, instance: Any, nbytes: int) -> int:
        """Admit ``nbytes`` of runtime-owned memory for ``instance``, or raise AdapterError with the figures."""
        ...

    def capacity(self, gpu: str) -> int | None:
        """The GPU's total memory, if this process can measure it or a controller (or engine) gave it."""
        ...


class SharedElasticLedger:
    """The elastic side of ``kvpolicy.runtime`` (the shared-memory ledger under ``KVPOLICY_LEDGER_DIR``)."""

    def __init__(self, env: AdapterEnv) -> None:
        self._env = env

    def attach(self, key: InstanceKey, gpu: str, guarantee: int) -> Any:
        from kvpolicy.runtime.engines import attach_vllm
        from kvpolicy.runtime.errors import LedgerError

        try:
            inst = attach_vllm(key, gpu, self._env.ledger_dir, guarantee=guarantee, elastic=True)
        except LedgerError as exc:
            raise AdapterError(f"kvpolicy: cannot attach {key.id} to the ledger for its elastic KV cache: {exc}") from None
        return inst.limit_source()

    def admit_pinned(self, instance: Any, nbytes: int) -> int:
        # The same static admission the runtime-owned path makes (GPU figures measured here
        # before any controller published).
        from kvpolicy.runtime.engines import admit_static

        return admit_static(instance, nbytes, self._env.policy)

    def capacity(self, gpu: str) -> int | None:
        from kvpolicy.runtime.client import resolve_access
        from kvpolicy.runtime.engines import measure_gpu
        from kvpolicy.runtime.errors import LedgerError
        from kvpolicy.runtime.ledger import GpuLedger

        measured = measure_gpu()
        if measured is not None:
            return measured.capacity
        try:
            ledger = GpuLedger.open(self._env.ledger_dir, gpu, resolve_access())
        except (LedgerError, OSError):
            return None
        try:
            figures = ledger.figures()
        finally:
            ledger.close()
        return figures.capacity if figures.source != "none" else None


_ledger: ElasticLedger | None = None


def set_elastic_ledger(ledger: ElasticLedger | None) -> None:
    """Use ``ledger`` in this process (None: back to the shared-memory ledger)."""
    global _ledger
    _ledger = ledger


def elastic_ledger() -> ElasticLedger:
    return _ledger if _ledger is not None else SharedElasticLedger(AdapterEnv.from_environ())
