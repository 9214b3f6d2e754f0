"""The runtime: the per-GPU shared-memory ledger, its engine client, and the controller's view.

Imports are lazy so that ``import kvpolicy.runtime`` stays cheap in engine processes;
nothing here needs torch, cuda-python or lark.

- ``EngineSession.open(EngineIdentity(...))``: the engine adapters' one port to the ledger
  (``session``): admit the static reserve, report pools, an elastic pool's limit source;
  a tensor-parallel engine's ranks admit all or none (``RankGroup``, ``group``).
- ``attach(...)`` → ``Instance``: the engine's side underneath (``client``).
- ``LedgerDir``: the controller's side (``directory``): facts, publish, reclaim, heartbeat.
- ``write_status`` / ``read_status`` / ``live_status``: ``<ledger-dir>/status.json`` (``status``).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "EngineSession": "kvpolicy.runtime.session",
    "EngineIdentity": "kvpolicy.runtime.session",
    "MeasuredGpu": "kvpolicy.runtime.session",
    "ledger_capacity": "kvpolicy.runtime.session",
    "RankGroup": "kvpolicy.runtime.group",
    "GroupAdmission": "kvpolicy.runtime.group",
    "GroupRefused": "kvpolicy.runtime.group",
    "GroupAdmissionFailed": "kvpolicy.runtime.group",
    "attach": "kvpolicy.runtime.client",
    "Instance": "kvpolicy.runtime.client",
    "detach_all": "kvpolicy.runtime.client",
    "DEFAULT_LEDGER_DIR": "kvpolicy.runtime.client",
    "LedgerDir": "kvpolicy.runtime.directory",
    "LedgerView": "kvpolicy.runtime.directory",
    "GpuSample": "kvpolicy.runtime.directory",
    "GpuLedger": "kvpolicy.runtime.ledger",
    "GpuLimits": "kvpolicy.runtime.values",
    "InstanceLimits": "kvpolicy.runtime.values",
    "SlotView": "kvpolicy.runtime.values",
    "Access": "kvpolicy.runtime.segment",
    "Status": "kvpolicy.runtime.status",
    "write_status": "kvpolicy.runtime.status",
    "read_status": "kvpolicy.runtime.status",
    "live_status": "kvpolicy.runtime.status",
    "LedgerError": "kvpolicy.runtime.errors",
    "AdmissionRefused": "kvpolicy.runtime.errors",
    "CorruptSegment": "kvpolicy.runtime.errors",
    "ForeignSegment": "kvpolicy.runtime.errors",
    "LayoutVersionMismatch": "kvpolicy.runtime.errors",
    "UnsafeSegment": "kvpolicy.runtime.errors",
    "SlotsFull": "kvpolicy.runtime.errors",
    "DuplicateInstance": "kvpolicy.runtime.errors",
    "Detached": "kvpolicy.runtime.errors",
}

__all__ = [
    "DEFAULT_LEDGER_DIR",
    "Access",
    "AdmissionRefused",
    "CorruptSegment",
    "Detached",
    "DuplicateInstance",
    "EngineIdentity",
    "EngineSession",
    "ForeignSegment",
    "GpuLedger",
    "GpuLimits",
    "GpuSample",
    "GroupAdmission",
    "GroupAdmissionFailed",
    "GroupRefused",
    "Instance",
    "InstanceLimits",
    "LayoutVersionMismatch",
    "LedgerDir",
    "LedgerError",
    "LedgerView",
    "MeasuredGpu",
    "RankGroup",
    "SlotView",
    "SlotsFull",
    "Status",
    "UnsafeSegment",
    "attach",
    "detach_all",
    "ledger_capacity",
    "live_status",
    "read_status",
    "write_status",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvpolicy.runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
