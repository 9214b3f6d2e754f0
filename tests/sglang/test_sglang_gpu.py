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
    from tests.sglang import gpu_footprint

    results = gpu_footprint.run_cases()
    assert [r["case"] for r in results] == ["tiny", "flash-8GiB", "flash-32GiB"]
    for r in results:
        assert gpu_footprint.problems(r) == [], r


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_a_launch_on_this_gpu_resolves_what_plan_assumes(sglang_env, tmp_path, model):
    """Real resolution with ``--device cuda`` and nothing stubbed (SGLang reads nvidia-smi itself) against
    the mirror for the memory SGLang read; on an H200 that is plan's default hardware."""
    import shutil

    from kvpolicy.adapters.sglang_dsv4.geometry import load_geometry
    from kvpolicy.adapters.sglang_dsv4.launch import H200_MEMORY_MIB, Hardware, resolve_launch
    from kvpolicy.units import MiB
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import get_device_memory_capacity
    from tests.sglang.sglang_support import MODELS, engine_reading, published_resolution, single_process_parallel

    (tmp_path / model).mkdir()
    shutil.copy(MODELS / f"{model}.json", tmp_path / model / "config.json")
    args = prepare_server_args(["--model-path", str(tmp_path / model), "--device", "cuda"])
    args.resolve_once()
    mib = get_device_memory_capacity("cuda")
    with single_process_parallel(), published_resolution(args):
        live, kv_cache_dtype, _kvc = engine_reading(args)
    geometry = load_geometry(tmp_path / model / "config.json")
    ours = resolve_launch(geometry, Hardware(gpu_memory=int(mib * MiB)))
    assert (live, kv_cache_dtype) == (ours.settings, ours.report.kv_cache_dtype), mib
    if mib == H200_MEMORY_MIB:
        assert resolve_launch(geometry).settings == live  # plan's default hardware is this GPU
