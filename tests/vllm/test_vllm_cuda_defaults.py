"""``plan --platform cuda`` assumes what vLLM 0.33's own CUDA choices give on the GPU class it names.

A plan cannot see the GPU; it assumes a Hopper GPU of 70 to 160 GiB (H100, H200), or for an MXFP4
DeepSeek-V4 indexer a Blackwell datacenter GPU of 160 GiB or more. This machine has no GPU, so vLLM's own
choice functions run here with the device faked:

- the server's batch defaults: ``EngineArgs.get_batch_defaults`` with the platform's memory, name and compute
  capability stood in for an H100, an H200 and a B200;
- the attention backend and its block size: ``CudaPlatform.get_valid_backends`` for compute capability 9.0,
  each backend's own checks, then the chosen one's ``get_preferred_block_size`` from vLLM's default 16. What
  needs the CUDA build's kernels is stood in for as vLLM's CUDA wheels have them on Hopper: the extension
  module the CUDA platform imports, FlashAttention 3's MLA support (``flash_attn_supports_mla``) and FlashMLA's
  dense kernels (``is_flashmla_dense_supported``). FlashInfer is not installed here: a backend that cannot be
  imported must not rank above the one chosen.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from kvpolicy.adapters.vllm_adapter.planning import platform as pf
from kvpolicy.adapters.vllm_adapter.planning.hf_config import ModelSpecError, mla_cuda_block_size

pytestmark = pytest.mark.vllm

GiB = 1 << 30
GPUS = [  # (name as CUDA reports it, total memory, compute capability) → the plan's class for it
    ("NVIDIA H100 80GB HBM3", 79 * GiB + GiB // 2, (9, 0), pf.HOPPER),
    ("NVIDIA H200", 139 * GiB + GiB // 2, (9, 0), pf.HOPPER),
    ("NVIDIA B200", 178 * GiB + GiB // 2, (10, 0), pf.BLACKWELL),
]


@pytest.mark.parametrize(("name", "memory", "capability", "gpu"), GPUS, ids=[g[0] for g in GPUS])
def test_the_server_batch_defaults_are_vllms_for_the_gpu_class(monkeypatch: pytest.MonkeyPatch, name: str,
                                                               memory: int, capability: tuple[int, int],
                                                               gpu: pf.CudaGpu) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext

    for attr, value in (("get_device_total_memory", lambda *a, **k: memory), ("get_device_name", lambda *a, **k: name),
                        ("is_device_capability", lambda cap, *a, **k: tuple(cap) == capability),
                        ("is_cpu", lambda: False), ("is_tpu", lambda: False)):
        monkeypatch.setattr(current_platform, attr, value)
    batched, seqs = EngineArgs.get_batch_defaults(world_size=1)
    assert (batched[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]) == (
        gpu.batched_tokens, gpu.max_num_seqs)
    assert pf.batched_tokens("cuda", "standard", None, False, 1 << 20, 1, gpu).value == gpu.batched_tokens


@pytest.fixture
def cuda_backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """vLLM's CUDA platform class, importable on this CPU, with Hopper's kernels stood in for; the modules that
    import only with the stand-ins are forgotten afterwards (another test's import fails as it would)."""
    stood_in = [m for m in ("vllm.platforms.cuda", "vllm.v1.attention.backends.mla.flashattn_mla")
                if m not in sys.modules]
    yield _cuda_platform(monkeypatch)
    for name in stood_in:
        sys.modules.pop(name, None)


def _cuda_platform(monkeypatch: pytest.MonkeyPatch) -> Any:
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except ImportError:  # the CUDA build's extension needs libcuda: its symbols are not used here
        monkeypatch.setitem(sys.modules, "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.v1.attention.backends import fa_utils

    for kernel in ("flash_attn_varlen_func", "get_scheduler_metadata", "reshape_and_cache_flash"):
        monkeypatch.setattr(fa_utils, kernel, getattr(fa_utils, kernel, None), raising=False)
    cuda = importlib.import_module("vllm.platforms.cuda")
    flashattn_mla = importlib.import_module("vllm.v1.attention.backends.mla.flashattn_mla")
    monkeypatch.setattr(flashattn_mla, "flash_attn_supports_mla", lambda: True)  # FA3 on Hopper
    flashmla_ops = importlib.import_module("vllm.v1.attention.ops.flashmla")
    monkeypatch.setattr(flashmla_ops, "is_flashmla_dense_supported", lambda: (True, None))
    return cuda.CudaPlatform


def hopper_choice(platform: Any, use_mla: bool, head_size: int, kv_cache_dtype: str) -> tuple[str, int] | None:
    """(backend, block size) vLLM picks on compute capability 9.0 without --block-size, or None when none fits."""
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    selector = AttentionSelectorConfig(head_size=head_size, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
                                       block_size=None, use_mla=use_mla)
    valid, invalid = platform.get_valid_backends(DeviceCapability(9, 0), selector)
    best = min(valid, key=lambda c: c.priority) if valid else None
    # A backend this machine cannot import must not outrank the choice; FlashInfer's MLA backend alone may
    # (it declares compute capability 10.x only, so Hopper never takes it).
    unknown = {b.name for b, (priority, reasons) in invalid.items()
               if any(r.startswith(("ImportError", "ModuleNotFoundError")) for r in reasons)
               and (best is None or priority < best.priority)}
    assert unknown <= {"FLASHINFER_MLA"}, (unknown, best)
    if best is None:
        return None
    return best.backend.name, best.backend_class.get_preferred_block_size(16)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"])
def test_the_mla_block_size_is_the_hopper_backends(cuda_backends: Any, kv_cache_dtype: str) -> None:
    choice = hopper_choice(cuda_backends, True, 576, kv_cache_dtype)  # DeepSeek-V2/V3's latent + RoPE
    if choice is None:  # vLLM finds no backend: the plan refuses the launch
        with pytest.raises(ModelSpecError, match="none of vLLM's MLA backends for Hopper"):
            pf.check_attention_backend("cuda", "mla", kv_cache_dtype, "0.33.0")
        return
    pf.check_attention_backend("cuda", "mla", kv_cache_dtype, "0.33.0")
    assert choice[1] == mla_cuda_block_size(kv_cache_dtype), choice


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_the_standard_block_size_is_the_hopper_backends(cuda_backends: Any, kv_cache_dtype: str,
                                                        head_size: int) -> None:
    """FlashAttention, vLLM's first choice for a 16-bit cache on Hopper: 16 (fp8 may go to FlashInfer, absent here)."""
    assert hopper_choice(cuda_backends, False, head_size, kv_cache_dtype) == ("FLASH_ATTN", 16)
