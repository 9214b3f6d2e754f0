"""A stand-in for nvidia-ml-py's ``pynvml`` module: the NVML answers of a machine this one is not.

Only the hardware is pretended: the functions kvpolicy calls, with pynvml's names, error
class and constants, answering for a list of GPUs (some in MIG mode). ``install`` puts it
in ``sys.modules`` as ``pynvml``, which is where kvpolicy reads NVML from; a child process
gets it with ``KVPOLICY_TEST_FAKE_NVML`` (a JSON list of GPUs) and ``child_prelude``.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any

NVML_DEVICE_MIG_ENABLE = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
GiB = 1 << 30


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


@dataclass
class FakeMig:
    uuid: str
    memory: int
    gi: int = 1
    ci: int = 0
    place: int = 0
    """Its index among the parent's MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex)."""


@dataclass
class FakeGpu:
    uuid: str
    memory: int = 141 * GiB
    used: int = 0
    mig: bool | None = None
    """None: no MIG support (GetMigMode raises NOT_SUPPORTED); False: supported, off; True: on."""
    migs: list[FakeMig] = field(default_factory=list)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


def module(gpus: list[FakeGpu]) -> types.ModuleType:
    """A ``pynvml`` whose machine has ``gpus``, in NVML index order."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE  # type: ignore[attr-defined]
    nv.calls = []  # type: ignore[attr-defined]

    def init() -> None:
        nv.calls.append("nvmlInit")  # type: ignore[attr-defined]

    def count() -> int:
        return len(gpus)

    def by_index(i: int) -> _Handle:
        if not 0 <= i < len(gpus):
            raise NVMLError(2)  # INVALID_ARGUMENT
        return _Handle(gpus[i])

    def uuid(h: _Handle) -> str:
        return h.mig.uuid if h.mig is not None else h.gpu.uuid

    def mig_mode(h: _Handle) -> list[int]:
        if h.gpu.mig is None or h.mig is not None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        on = int(bool(h.gpu.mig))
        return [on, on]

    def max_migs(h: _Handle) -> int:
        return 7 if h.gpu.mig else 0  # an H100's, and 0 with MIG off (tests/runtime/test_nvml_stand_in.py)

    def mig_by_index(h: _Handle, k: int) -> _Handle:
        for m in h.gpu.migs:
            if m.place == k:
                return _Handle(h.gpu, m)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def memory(h: _Handle) -> Any:
        if h.mig is not None:
            return types.SimpleNamespace(total=h.mig.memory, used=0, free=h.mig.memory)
        return types.SimpleNamespace(total=h.gpu.memory, used=h.gpu.used, free=h.gpu.memory - h.gpu.used)

    nv.nvmlInit = init  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = count  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = by_index  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUUID = uuid  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMigMode = mig_mode  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMaxMigDeviceCount = max_migs  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_by_index  # type: ignore[attr-defined]
    nv.nvmlDeviceGetGpuInstanceId = lambda h: h.mig.gi  # type: ignore[attr-defined]
    nv.nvmlDeviceGetComputeInstanceId = lambda h: h.mig.ci  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    return nv


def install(gpus: list[FakeGpu]) -> types.ModuleType:
    """Make ``import pynvml`` give the fake (for this process)."""
    nv = module(gpus)
    sys.modules["pynvml"] = nv
    return nv


ENV = "KVPOLICY_TEST_FAKE_NVML"


def to_env(gpus: list[FakeGpu]) -> str:
    return json.dumps([
        {"uuid": g.uuid, "memory": g.memory, "used": g.used, "mig": g.mig, "migs": [vars(m) for m in g.migs]}
        for g in gpus
    ])


def from_env(text: str) -> list[FakeGpu]:
    return [
        FakeGpu(uuid=g["uuid"], memory=g["memory"], used=g["used"], mig=g["mig"], migs=[FakeMig(**m) for m in g["migs"]])
        for g in json.loads(text)
    ]


def install_from_env() -> None:
    """In a child process: the machine ``KVPOLICY_TEST_FAKE_NVML`` describes, or no NVML at all when it is empty."""
    import os

    text = os.environ.get(ENV)
    if text is None:
        return
    if text:
        install(from_env(text))
    else:
        sys.modules["pynvml"] = None  # type: ignore[assignment]  # `import pynvml` fails: no NVML
