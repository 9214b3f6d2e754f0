"""What the controller knows of each GPU's memory: capacity, and what is in use.

Sources, best first: NVML (through nvidia-ml-py: the whole GPU, every process),
a fixed ``--gpu-capacity`` for machines without a GPU, or the GPUs of a facts
file. GPU ids are ``cuda:N`` with N the GPU's NVML index (PCI bus order), the
same on every engine whatever its ``CUDA_VISIBLE_DEVICES``: see ``gpu_id``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

from kvpolicy.facts import Facts
from kvpolicy.runtime.directory import GpuSample
from kvpolicy.runtime.values import check_bytes


class GpuSampler(Protocol):
    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        """Figures for the GPUs it knows among ``gpu_ids``."""
        ...

    @property
    def description(self) -> str: ...


class NvmlSampler:
    """Capacity and use of every local GPU, read through NVML."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._count = pynvml.nvmlDeviceGetCount()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._count)]

    @property
    def description(self) -> str:
        return f"NVML ({self._count} GPU(s))"

    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        samples: dict[str, GpuSample] = {}
        for gpu in gpu_ids:
            index = _index(gpu)
            if index is None or index >= self._count:
                continue
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handles[index])
            samples[gpu] = GpuSample(capacity=int(info.total), used=int(info.used))
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
        self.gpus = {g.id: g for g in facts.gpus}

    @property
    def description(self) -> str:
        return f"facts file ({len(self.gpus)} GPU(s))"

    def sample(self, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
        return {
            gpu: GpuSample(capacity=self.gpus[gpu].capacity, other_used=self.gpus[gpu].other_used)
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


def _index(gpu: str) -> int | None:
    prefix, _, number = gpu.partition(":")
    return int(number) if prefix == "cuda" and number.isdigit() else None


def gpu_id(local_index: int) -> str:
    """The ledger id of the process's CUDA device ``local_index``: ``cuda:N``, N its NVML index.

    With ``CUDA_VISIBLE_DEVICES=2,3`` the process's ``cuda:0`` is the machine's
    GPU 2, so two engines that see the same GPU under different local numbers
    still share one ledger segment. Entries may be indices or ``GPU-<uuid>``
    (resolved through NVML). Assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or GPUs of
    one model, for which CUDA's default order is the PCI order too.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return f"cuda:{local_index}"
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if local_index >= len(entries):
        raise ValueError(f"CUDA device {local_index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[local_index]
    if entry.isdigit():
        return f"cuda:{int(entry)}"
    return f"cuda:{_nvml_index_of_uuid(entry)}"


def _nvml_index_of_uuid(uuid: str) -> int:
    import pynvml

    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        found = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
        found = found.decode() if isinstance(found, bytes) else found
        if found == uuid or found.startswith(uuid):
            return i
    raise ValueError(f"no GPU with UUID {uuid!r} (from CUDA_VISIBLE_DEVICES)")
