"""The elastic pool's loop on a real GPU: vLLM's BlockPool over cuda-python VMM memory.

The same synthetic scheduler as test_pool_loop.py (pool_loop.soak), with the CUDA driver:
growth maps, zeroes and hands out chunks; lowered limits unmap them (after a device
synchronisation); the "model" writes and re-reads every token's signature on the GPU.
At the end cuMemGetInfo is back at its baseline. Runs where vLLM's package cannot be
installed: ``vllm`` may be the minimal package from vllm_min.py (PYTHONPATH).

    PYTHONPATH=/tmp/site:.device/vllm_min python -P -m pytest -m gpu tests/vllm_elastic/test_elastic_gpu.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.fixture(scope="module")
def cuda_driver():
    torch = pytest.importorskip("torch")
    from kvpolicy.alloc import DriverUnavailable, open_driver

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    try:
        driver = open_driver("cuda", device=torch.cuda.current_device())
    except DriverUnavailable as exc:
        pytest.skip(f"no usable CUDA GPU: {exc}")
    yield driver
    driver.close()


def _settled_free(driver) -> int:
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return driver.mem_info()[0]


def test_the_loop_on_the_gpu_and_memory_back_to_baseline(cuda_driver) -> None:
    from tests.vllm_elastic.pool_loop import soak

    import vllm

    manifest = Path(vllm.__file__).resolve().parents[1] / "MANIFEST.json"
    if manifest.is_file():  # the minimal package: check its real files are vLLM 0.33.0's, byte for byte
        from tests.vllm_elastic.vllm_min import verify

        verify(manifest.parent)
    soak(cuda_driver, "cuda", steps=60, seed=0)  # warm up: kernels load lazily and take device memory once
    before = _settled_free(cuda_driver)
    out = soak(cuda_driver, "cuda", steps=3000, seed=1)
    after = _settled_free(cuda_driver)
    out["free_before"], out["free_after"] = before, after
    report = os.environ.get("KVPOLICY_GPU_REPORT")
    if report:
        Path(report).write_text(json.dumps(out, indent=1, default=str))
    stats = out["stats"]
    assert stats["finished"] > 100 and stats["hit_blocks"] > 0 and stats["verified_tokens"] > 50_000
    assert (2, "deferred") in out["acks"] and (2, "applied") in out["acks"] and (3, "applied") in out["acks"]
    assert 96 * MiB - 6 * MiB < out["peak_phase1"] <= 96 * MiB and out["peak_phase3"] > 96 * MiB
    assert out["idle_held"] == out["pinned"]
    assert cuda_driver.live_handles == 0 and cuda_driver.mapped_bytes == 0 and cuda_driver.reserved_bytes == 0
    assert after == before, f"cuMemGetInfo free went from {before} to {after} ({(after - before) / MiB:+.1f} MiB)"
