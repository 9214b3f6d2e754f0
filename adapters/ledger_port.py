"""The engine side of the ledger port, for both adapters: what only an engine process knows.

The port itself is ``kvpolicy.runtime.session`` (``EngineSession``); each adapter maps
its engine's ranks to an ``EngineIdentity`` and opens sessions through ``open_session``.
What this module adds is engine-specific:

- ``gpu_measure(policy)``: the figures an engine offers before any controller has
  published (docs/ledger.md, "Before the controller") — the current CUDA device's
  total and used memory (``measure_gpu``: torch if it has initialised CUDA, else
  cuda-python), with the headroom and any ``capacity`` override of the policy
  (``policy_gpu_figures``). A CPU engine's device (``HOST_DEVICE``) is measured by
  nothing: its figures are the policy's ``capacity`` for it, or the controller's.
- ``gpu_capacity(gpu, env)``: the GPU's total memory, to resolve the policy's
  percentages: measured here, else what the ledger's figures say.
- ``as_startup_failure(context)``: the one translation of ledger errors. Around
  the code where an adapter hands control back to the engine at start-up, an
  ``AdmissionRefused`` (or any other ``LedgerError``) becomes the ``AdapterError``
  that stops the engine, with the ledger's message — every figure — and ``context``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpolicy.adapters.common import read_policy
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.gpu_identity import display_name
from kvpolicy.runtime.session import EngineIdentity, EngineSession, GpuMeasure, MeasuredGpu, ledger_capacity


HOST_DEVICE = "cpu:0"
"""The ledger's device key of a CPU engine's KV cache: the host's memory, one ledger for every CPU
engine of the host (NUMA nodes are not told apart)."""


def is_host_device(gpu: str) -> bool:
    """Whether ``gpu`` names host memory (a CPU engine's device) rather than a GPU."""
    return gpu.partition(":")[0] == "cpu"


@dataclass(frozen=True)
class Measured:
    """The current device's memory, as the CUDA driver reports it."""

    capacity: int
    used: int


def measure_gpu() -> Measured | None:
    """Total and used memory of the current CUDA device, or None without a CUDA runtime in this process."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        return Measured(capacity=int(total), used=int(total - free))
    try:
        from kvpolicy.alloc.driver import import_cuda_bindings

        driver = import_cuda_bindings()  # either cuda-python layout (12.6.0 has only the older one)
        err, free, total = driver.cuMemGetInfo()
    except Exception:  # noqa: BLE001 - no cuda-python, or no driver library on this machine (DynamicLibNotFoundError)
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None  # no current context: the controller's figures are needed
    return Measured(capacity=int(total), used=int(total - free))


def policy_gpu_figures(policy: Path | None, gpu: str, capacity: int) -> tuple[int, int]:
    """(capacity, headroom) for ``gpu`` from the policy file (capacity override applied); headroom 0 without one.

    The policy's ``gpu "X"`` blocks match the UUID or the display name this process's NVML gives it
    (in a container, the container's numbering: the controller's figures, once published, use the machine's)."""
    from kvpolicy.policy.resolve import gpu_settings

    if policy is None:
        return capacity, 0
    settings = gpu_settings(read_policy(policy), gpu, display_name(gpu))
    cap = settings.capacity if settings.capacity is not None else capacity
    return cap, settings.headroom_bytes(cap)


def gpu_measure(policy: Path | None) -> GpuMeasure:
    """The session's ``measure``: this process's device, with ``policy``'s figures for the GPU.

    Called only while no controller has published, so an engine started under a
    controller never reads the policy for it.
    """

    def measure(gpu: str) -> MeasuredGpu | None:
        from kvpolicy.policy.resolve import gpu_settings

        if is_host_device(gpu):  # no driver to ask: the policy's capacity is the host's budget
            if policy is None:
                return None
            settings = gpu_settings(read_policy(policy), gpu)
            if settings.capacity is None:
                return None
            return MeasuredGpu(capacity=settings.capacity, headroom=settings.headroom_bytes(settings.capacity), in_use=0)
        measured = measure_gpu()
        if measured is None:
            return None
        capacity, headroom = policy_gpu_figures(policy, gpu, measured.capacity)
        return MeasuredGpu(capacity=capacity, headroom=headroom, in_use=measured.used)

    return measure


def open_session(identity: EngineIdentity, env: AdapterEnv, **options: Any) -> EngineSession:
    """The session of ``identity`` in the ledger under ``env.ledger_dir``, measuring with ``env.policy``.

    ``options``: ``EngineSession.open``'s (``guarantee``, ``elastic``). Raises ``LedgerError``.
    """
    return EngineSession.open(identity, measure=gpu_measure(env.policy), ledger_dir=env.ledger_dir, **options)


def gpu_capacity(gpu: str, env: AdapterEnv) -> int | None:
    """The GPU's total memory: measured in this process, else the ledger's figures; None if neither has it."""
    measured = None if is_host_device(gpu) else measure_gpu()
    if measured is not None:
        return measured.capacity
    return ledger_capacity(gpu, env.ledger_dir)


@contextmanager
def as_startup_failure(context: str | Callable[[], str] | None = None) -> Iterator[None]:
    """At an adapter's edge: a ledger error becomes the ``AdapterError`` that stops the engine's start.

    The message is the ledger's (an ``AdmissionRefused`` names every figure), then ``context``
    in parentheses: what the adapter was doing, e.g. where the policy sets the reserve (a
    callable is asked only on failure).
    """
    try:
        yield
    except LedgerError as exc:
        what = context() if callable(context) else context
        raise AdapterError(f"{exc} ({what})" if what else str(exc)) from None


__all__ = [
    "HOST_DEVICE",
    "Measured",
    "as_startup_failure",
    "gpu_capacity",
    "gpu_measure",
    "is_host_device",
    "measure_gpu",
    "open_session",
    "policy_gpu_figures",
]
