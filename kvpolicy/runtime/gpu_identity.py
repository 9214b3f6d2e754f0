"""Which GPU a CUDA device is: its UUID, read through NVML, is the ledger's key for it.

Inside a container an engine usually sees its GPU as ``cuda:0`` whatever the physical
GPU, so a device number cannot key the ledger: two engines on different GPUs would
share one segment, and one GPU seen under two numbers would have two. The key is the
UUID NVML gives the device (``GPU-<36 characters>``, or ``MIG-<36>`` for a MIG
instance, which is a GPU of its own); ``cuda:N`` — N the NVML index, in the numbering
of the process that reads it — is only its display name.

A process's CUDA device ``i`` is the ``i``-th entry of ``CUDA_VISIBLE_DEVICES`` (all
devices when it is unset), and an entry is an index, a ``GPU-`` UUID or a unique
prefix of one, a ``MIG-`` UUID, or an old-style ``MIG-GPU-<uuid>/<gi>/<ci>``. An index
is NVML's index, which CUDA's numbering matches with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
or GPUs of one model. A GPU in MIG mode is not a device of its own: an index or GPU
UUID naming one stands for its one visible MIG instance, and is refused when it has
several (name the instance by its ``MIG-`` UUID).

Without NVML (no nvidia-ml-py, no driver library) ids fall back to ``cuda:N`` with N
the entry's index (what layout 2 used), with a warning: correct only where every
engine sees the machine's numbering (no containers that renumber). A full UUID in
``CUDA_VISIBLE_DEVICES`` is still used as the key without NVML.

``nvml`` arguments take a module with pynvml's functions (tests pass a stand-in);
``None`` loads nvidia-ml-py.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kvpolicy.gpus")

UUID_RE = re.compile(r"(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
"""A full device UUID as NVML writes it: 40 characters."""

_OLD_MIG_RE = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)")


def is_uuid(gpu: str) -> bool:
    """Whether ``gpu`` is a full GPU or MIG UUID (a ledger key NVML gave), not a fallback ``cuda:N``."""
    return UUID_RE.fullmatch(gpu) is not None


def index_of(gpu: str) -> int | None:
    """N of a ``cuda:N`` id, else None."""
    prefix, _, number = gpu.partition(":")
    return int(number) if prefix == "cuda" and number.isdigit() else None


@dataclass(frozen=True)
class Device:
    """One device as NVML shows it to this process: a GPU, or one MIG instance of a GPU in MIG mode."""

    uuid: str
    index: int
    """The NVML index of the GPU (of the parent GPU, for a MIG instance)."""
    handle: Any
    mig: int | None = None
    """The MIG device's index on its parent; None for a whole GPU."""
    parent_uuid: str | None = None

    @property
    def name(self) -> str:
        """The display name: ``cuda:N``, or ``cuda:N/mig:K`` for MIG instance K of GPU N."""
        return f"cuda:{self.index}" if self.mig is None else f"cuda:{self.index}/mig:{self.mig}"


@dataclass(frozen=True)
class Gpu:
    """A GPU NVML lists: its device, and its MIG instances when it is in MIG mode (None when not)."""

    device: Device
    migs: tuple[Device, ...] | None


@dataclass(frozen=True)
class GpuIdentity:
    """A CUDA device as the ledger knows it."""

    id: str
    """The ledger's key (and segment file name): the UUID, or ``cuda:N`` without NVML."""
    name: str
    """The display name, ``cuda:N`` in this process's NVML numbering (the id itself without NVML)."""
    index_id: str
    """The index-based id ``cuda:N``: the key without NVML, and layout 2's key for this device."""


def load_nvml() -> Any | None:
    """nvidia-ml-py, initialised, or None where there is no NVML (no package, driver or GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...: no NVML
        return None
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_gpus(nvml: Any) -> list[Gpu]:
    """Every GPU NVML lists, in NVML index order, with its MIG instances."""
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        device = Device(uuid=_text(nvml.nvmlDeviceGetUUID(handle)), index=i, handle=handle)
        gpus.append(Gpu(device, _migs(nvml, device)))
    return gpus


def _migs(nvml: Any, gpu: Device) -> tuple[Device, ...] | None:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(gpu.handle)
    except nvml.NVMLError:  # NOT_SUPPORTED: a GPU without MIG
        return None
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    found = []
    for k in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, k)
        except nvml.NVMLError:  # NOT_FOUND: no instance in this place (or not visible here)
            continue
        found.append(Device(uuid=_text(nvml.nvmlDeviceGetUUID(handle)), index=gpu.index, handle=handle, mig=k,
                            parent_uuid=gpu.uuid))
    return tuple(found)


def ledger_devices(gpus: list[Gpu]) -> list[Device]:
    """The devices that are GPUs for the ledger: whole GPUs not in MIG mode, and every MIG instance."""
    return [d for g in gpus for d in ((g.device,) if g.migs is None else g.migs)]


def visible_entry(local_index: int, environ: Mapping[str, str] | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of this process's CUDA device ``local_index`` (its index when unset)."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return str(local_index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= local_index < len(entries):
        raise ValueError(f"CUDA device {local_index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    return entries[local_index]


def local_gpu(local_index: int, environ: Mapping[str, str] | None = None, nvml: Any | None = None) -> GpuIdentity:
    """The ledger identity of this process's CUDA device ``local_index`` (through ``CUDA_VISIBLE_DEVICES``).

    Raises ValueError (``kvpolicy: cannot tell which GPU ...``, and why) when nothing names it."""
    try:
        entry = visible_entry(local_index, environ)
    except ValueError as exc:
        raise ValueError(f"{_CANNOT_TELL}: {exc}") from None
    return entry_gpu(entry, nvml)


def entry_gpu(entry: str, nvml: Any | None = None) -> GpuIdentity:
    """The ledger identity of the device a ``CUDA_VISIBLE_DEVICES`` entry names. Raises ValueError."""
    nv = load_nvml() if nvml is None else nvml
    try:
        if nv is None:
            return _without_nvml(entry)
        device = _find(entry, nvml_gpus(nv), nv)
    except ValueError as exc:
        raise ValueError(f"{_CANNOT_TELL}: {exc}") from None
    return GpuIdentity(id=device.uuid, name=device.name, index_id=f"cuda:{device.index}")


_CANNOT_TELL = "kvpolicy: cannot tell which GPU this process's CUDA device is (the ledger's key for it)"


_warned = False


def _without_nvml(entry: str) -> GpuIdentity:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "kvpolicy: NVML is not available (nvidia-ml-py or the driver's libnvidia-ml): GPU ids fall back "
            "to cuda:N, the index in CUDA_VISIBLE_DEVICES. Engines on different GPUs that both see cuda:0 "
            "(containers) would share one ledger: see docs/ledger.md, \"GPU ids\"."
        )
    if entry.isdigit():
        gpu = f"cuda:{int(entry)}"
        return GpuIdentity(id=gpu, name=gpu, index_id=gpu)
    if is_uuid(entry):
        return GpuIdentity(id=entry, name=entry, index_id=entry)
    raise ValueError(
        f"CUDA_VISIBLE_DEVICES entry {entry!r} is not an index or a full GPU-/MIG- UUID; without NVML "
        "it cannot be resolved to a UUID: give the full UUID (nvidia-smi -L), or make NVML available"
    )


def _find(entry: str, gpus: list[Gpu], nvml: Any) -> Device:
    where = f"CUDA_VISIBLE_DEVICES entry {entry!r}"
    if entry.isdigit():
        n = int(entry)
        if n >= len(gpus):
            raise ValueError(f"{where}: NVML lists {len(gpus)} GPU(s) here, so there is no GPU {n}")
        return _whole(gpus[n], where)
    old = _OLD_MIG_RE.fullmatch(entry)
    if old is not None:
        return _old_style_mig(old, gpus, nvml, where)
    if entry.startswith("MIG-"):
        matches = [m for g in gpus for m in g.migs or () if m.uuid.startswith(entry)]
        return _one(matches, where, "MIG instance")
    if entry.startswith("GPU-"):
        return _whole(_one([g for g in gpus if g.device.uuid.startswith(entry)], where, "GPU"), where)
    raise ValueError(f"{where} is neither an index nor a GPU-/MIG- UUID")


def _one(matches: list[Any], where: str, what: str) -> Any:
    if len(matches) != 1:
        raise ValueError(f"{where}: NVML lists {'no' if not matches else len(matches)} {what}(s) with that UUID")
    return matches[0]


def _whole(gpu: Gpu, where: str) -> Device:
    """A GPU named by index or UUID: itself, or its one MIG instance in MIG mode."""
    if gpu.migs is None:
        return gpu.device
    if len(gpu.migs) == 1:
        return gpu.migs[0]
    raise ValueError(
        f"{where}: GPU {gpu.device.index} ({gpu.device.uuid}) is in MIG mode with {len(gpu.migs)} MIG instances "
        "visible here; name the instance by its MIG- UUID (nvidia-smi -L)"
    )


def _old_style_mig(match: re.Match[str], gpus: list[Gpu], nvml: Any, where: str) -> Device:
    """``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470): the parent's instance with those ids."""
    parent = _one([g for g in gpus if g.device.uuid == match.group(1)], where, "GPU")
    wanted = (int(match.group(2)), int(match.group(3)))
    for m in parent.migs or ():
        if (nvml.nvmlDeviceGetGpuInstanceId(m.handle), nvml.nvmlDeviceGetComputeInstanceId(m.handle)) == wanted:
            return m
    raise ValueError(
        f"{where}: GPU {match.group(1)} has no MIG instance with GPU instance {wanted[0]}, compute instance {wanted[1]}"
    )


def find_device(uuid: str, nvml: Any | None = None) -> Device | None:
    """The device NVML knows by ``uuid`` in this process, or None (no NVML, or not a device here)."""
    if not is_uuid(uuid):
        return None
    nv = load_nvml() if nvml is None else nvml
    if nv is None:
        return None
    return next((d for d in ledger_devices(nvml_gpus(nv)) if d.uuid == uuid), None)


def index_id_of(uuid: str, nvml: Any | None = None) -> str | None:
    """``cuda:N`` for the device ``uuid`` (N its NVML index here): layout 2's id for it; None if NVML does not know it."""
    device = find_device(uuid, nvml)
    return None if device is None else f"cuda:{device.index}"


def display_name(gpu: str, nvml: Any | None = None) -> str | None:
    """The display name of ledger id ``gpu`` in this process's NVML numbering, if it is a UUID NVML knows."""
    device = find_device(gpu, nvml)
    return None if device is None else device.name
