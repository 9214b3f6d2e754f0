"""The NVML stand-in (``tests/support/fake_nvml.py``) against the real nvidia-ml-py, on a GPU machine.

Machines without NVML test GPU identity (MIG layouts, several GPUs, UUID prefixes) on the
stand-in. Here it is built from the real NVML's answers for this machine and must answer
every call kvpolicy makes as the real one does — the same kinds of values, the same
failures — and kvpolicy's own readings through either must agree.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpolicy.runtime.gpu_identity import entry_gpu, ledger_devices, load_nvml, local_gpu, nvml_gpus
from kvpolicy.runtime.gpus import NvmlSampler
from tests.support import fake_nvml
from tests.support.fake_nvml import FakeGpu, FakeMig

REAL = load_nvml()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REAL is None, reason="needs NVML (a GPU and its driver)")]


def mirror(nv: Any) -> list[FakeGpu]:
    """This machine as the stand-in's GPUs, from the real NVML's answers."""
    gpus = []
    for gpu in nvml_gpus(nv):
        memory = nv.nvmlDeviceGetMemoryInfo(gpu.device.handle)
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(gpu.device.handle)
            mig: bool | None = current == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError as exc:
            assert exc.value == fake_nvml.NVML_ERROR_NOT_SUPPORTED, exc  # what the stand-in raises for it
            mig = None
        migs = [
            FakeMig(uuid=d.uuid, memory=nv.nvmlDeviceGetMemoryInfo(d.handle).total, place=d.mig,
                    gi=nv.nvmlDeviceGetGpuInstanceId(d.handle), ci=nv.nvmlDeviceGetComputeInstanceId(d.handle))
            for d in gpu.migs or ()
        ]
        gpus.append(FakeGpu(uuid=gpu.device.uuid, memory=memory.total, used=memory.used, mig=mig, migs=migs))
    return gpus


def test_the_stand_in_answers_each_call_as_nvml_does() -> None:
    real, fake = REAL, fake_nvml.module(mirror(REAL))
    assert fake.nvmlDeviceGetCount() == real.nvmlDeviceGetCount() > 0
    for i in range(real.nvmlDeviceGetCount()):
        rh, fh = real.nvmlDeviceGetHandleByIndex(i), fake.nvmlDeviceGetHandleByIndex(i)
        r_uuid, f_uuid = real.nvmlDeviceGetUUID(rh), fake.nvmlDeviceGetUUID(fh)
        assert (type(f_uuid), f_uuid) == (type(r_uuid), r_uuid)
        r_mem, f_mem = real.nvmlDeviceGetMemoryInfo(rh), fake.nvmlDeviceGetMemoryInfo(fh)
        assert all(isinstance(getattr(m, k), int) for m in (r_mem, f_mem) for k in ("total", "used", "free"))
        assert f_mem.total == r_mem.total
        try:
            r_mode = list(real.nvmlDeviceGetMigMode(rh))
        except real.NVMLError as exc:
            with pytest.raises(fake.NVMLError) as fake_exc:
                fake.nvmlDeviceGetMigMode(fh)
            assert fake_exc.value.value == exc.value
        else:
            assert list(fake.nvmlDeviceGetMigMode(fh)) == r_mode and len(r_mode) == 2
            assert fake.nvmlDeviceGetMaxMigDeviceCount(fh) == real.nvmlDeviceGetMaxMigDeviceCount(rh)


def test_a_handle_past_the_last_gpu_fails_alike() -> None:
    real, fake = REAL, fake_nvml.module(mirror(REAL))
    n = real.nvmlDeviceGetCount()
    with pytest.raises(real.NVMLError) as r:
        real.nvmlDeviceGetHandleByIndex(n)
    with pytest.raises(fake.NVMLError) as f:
        fake.nvmlDeviceGetHandleByIndex(n)
    assert f.value.value == r.value.value


def test_kvpolicy_reads_the_same_machine_through_either() -> None:
    real, fake = REAL, fake_nvml.module(mirror(REAL))

    def devices(nv: Any) -> list[tuple[Any, ...]]:
        return [(d.uuid, d.index, d.mig, d.parent_uuid, d.name) for d in ledger_devices(nvml_gpus(nv))]

    assert devices(fake) == devices(real)
    uuid = nvml_gpus(real)[0].device.uuid
    for entry in ("0", uuid, uuid[:12]):  # an index, the UUID, a UUID prefix (CUDA_VISIBLE_DEVICES accepts each)
        assert entry_gpu(entry, fake) == entry_gpu(entry, real), entry
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    assert local_gpu(0, env, fake) == local_gpu(0, env, real)
    ids = [d[0] for d in devices(real)]
    r_sample, f_sample = NvmlSampler(real).sample(ids), NvmlSampler(fake).sample(ids)
    assert {g: (s.capacity, s.name) for g, s in f_sample.items()} == {g: (s.capacity, s.name) for g, s in r_sample.items()}
