"""On a CUDA GPU: the adapter's footprint against what the GPU really lost (cuMemGetInfo)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_reported_footprint_matches_the_gpu(sglang_env):
    import gpu_footprint

    results = gpu_footprint.run_cases()
    assert [r["case"] for r in results] == ["tiny", "flash-8GiB", "flash-32GiB"]
    for r in results:
        assert gpu_footprint.problems(r) == [], r
