"""The synthetic scheduler on vLLM's real BlockPool with the host driver — the loop the GPU test runs too."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from pool_loop import soak  # noqa: E402

from kvpolicy.alloc import HostDriver  # noqa: E402

MiB = 1 << 20


def test_the_gpu_loop_on_the_host_driver() -> None:
    driver = HostDriver(capacity=2 << 30)
    try:
        out = soak(driver, "cpu", steps=2000, seed=3)
        assert driver.in_use == 0 and driver.mapped_bytes == 0  # closing gave everything back
    finally:
        driver.close()
    stats = out["stats"]
    assert stats["finished"] > 100 and stats["hit_blocks"] > 0 and stats["verified_tokens"] > 50_000
    assert stats["misses"] > 0 and out["refusals"].get("limit", 0) > 0
    assert (2, "deferred") in out["acks"] and (2, "applied") in out["acks"] and (3, "applied") in out["acks"]
    assert 96 * MiB - 6 * MiB < out["peak_phase1"] <= 96 * MiB
    assert out["peak_phase3"] > 96 * MiB
    assert out["idle_held"] == out["pinned"] == 4 * MiB  # idle with target 0: the null block's chunks only
    assert out["zero_calls"] > 0
