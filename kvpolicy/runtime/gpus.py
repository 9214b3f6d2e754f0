"""What the controller knows of each GPU's memory: capacity, and what is in use.

Sources, best first: NVML (through nvidia-ml-py: the whole GPU, every process),
a fixed ``--gpu-capacity`` for machines without a GPU, or the GPUs of a facts
file. GPU ids are UUIDs, the same on every engine whatever its container or
``CUDA_VISIBLE_DEVICES``, and ``cuda:N`` without NVML (``gpu_identity``); NVML
also gives each GPU its display name, ``cuda:N`` in the controller's numbering.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from kvpolicy.facts import Facts
from kvpolicy.runtime.directory import GpuSample
from kvpolicy.runtime.gpu_identity import index_of, is_uuid, ledger_devices, load_nvml, local_gpu, nvml_gpus
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.values import check_bytes
from kvpolicy.units import format_bytes


class GpuSampler(Protocol):
    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        """Figures for the GPUs it knows among ``gpu_ids``."""
        ...

    @property
    def description(self) -> str: ...


class NvmlSampler:
    """Capacity and use of every local GPU and MIG instance, read through NVML, with their display names.

    GPUs are found by UUID (the ledger's key); a fallback ``cuda:N`` id (an engine without
    NVML) by NVML index. The GPUs are listed again at every sample, so a MIG instance made
    or removed while the controller runs is seen.
    """

    def __init__(self, nvml: Any | None = None) -> None:
        loaded = load_nvml() if nvml is None else nvml
        if loaded is None:
            raise RuntimeError("NVML is not available")
        self._nvml: Any = loaded
        self._count = len(nvml_gpus(self._nvml))

    @property
    def description(self) -> str:
        return f"NVML ({self._count} GPU(s))"

    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        gpus = nvml_gpus(self._nvml)
        self._count = len(gpus)
        by_uuid = {d.uuid: d for d in ledger_devices(gpus)}
        samples: dict[str, GpuSample] = {}
        for gpu in gpu_ids:
            device = by_uuid.get(gpu)
            index = index_of(gpu)
            if device is None and index is not None and index < len(gpus) and gpus[index].migs is None:
                device = gpus[index].device
            if device is None:
                continue
            info = self._nvml.nvmlDeviceGetMemoryInfo(device.handle)
            samples[gpu] = GpuSample(capacity=int(info.total), used=int(info.used), name=device.name)
        return samples


class StaticSampler:
    """``--gpu-capacity``: every GPU has this capacity; use comes from the ledger's figures."""

    def __init__(self, capacity: int) -> None:
        self.capacity = check_bytes("--gpu-capacity", capacity)

    @property
    def description(self) -> str:
        return f"--gpu-capacity {self.capacity}"

    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        return {gpu: GpuSample(capacity=self.capacity) for gpu in gpu_ids}


class FactsSampler:
    """The GPUs of a facts file: capacity and other use as written there."""

    def __init__(self, facts: Facts) -> None:
        for g in facts.gpus:
            check_bytes(f"GPU {g.id!r}'s capacity", g.capacity)
            check_bytes(f"GPU {g.id!r}'s other_used", g.other_used)
            if g.other_used > g.capacity:
                raise LedgerError(
                    f"kvpolicy run: GPU {g.id!r}'s other_used ({format_bytes(g.other_used)}) is more than its "
                    f"capacity ({format_bytes(g.capacity)}): every instance on it would get nothing; check the "
                    "figures and their units"
                )
        self.gpus = {g.id: g for g in facts.gpus}

    @property
    def description(self) -> str:
        return f"facts file ({len(self.gpus)} GPU(s))"

    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        return {
            gpu: GpuSample(capacity=self.gpus[gpu].capacity, other_used=self.gpus[gpu].other_used, name=self.gpus[gpu].name)
            for gpu in gpu_ids
            if gpu in self.gpus
        }


def nvml_sampler() -> NvmlSampler | None:
    """NVML if this machine has it and a GPU, else None."""
    try:
        sampler = NvmlSampler()
    except Exception:  # noqa: BLE001 - no driver, no GPU, no nvidia-ml-py: the caller falls back
        return None
    return sampler if sampler._count else None


def gpu_id(local_index: int) -> str:
    """The ledger id of this process's CUDA device ``local_index``: its UUID (``kvpolicy.runtime.gpu_identity``)."""
    return local_gpu(local_index).id


def mixed_ids_note(gpu_ids: Iterable[str]) -> str | None:
    """A warning when the ledger holds GPUs keyed by UUID beside fallback ``cuda:N`` ids (engines without NVML):
    one GPU may then have two segments whose engines do not see each other's memory."""
    ids = list(gpu_ids)
    fallback = sorted(g for g in ids if index_of(g) is not None)
    if fallback and any(is_uuid(g) for g in ids):
        return (
            f"GPUs keyed by UUID beside index-based ids ({', '.join(fallback)}): engines without NVML fell back "
            "to cuda:N and may share a GPU with engines that keyed it by UUID without seeing their memory; "
            "make NVML available to every engine (docs/ledger.md, \"GPU ids\")"
        )
    return None
