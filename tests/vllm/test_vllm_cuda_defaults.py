"""``plan --platform cuda`` assumes what vLLM 0.33's own CUDA choices give on the GPU class it names.

A plan cannot see the GPU; it assumes a Hopper GPU of 70 to 160 GiB (H100, H200), or for an MXFP4
DeepSeek-V4 indexer a Blackwell datacenter GPU of 160 GiB or more. This machine has no GPU, so vLLM's own
choice functions run here with the device faked:

- the server's batch defaults: ``EngineArgs.get_batch_defaults`` with the platform's memory, name and compute
  capability stood in for an H100, an H200 and a B200;
- the attention backend and its block size: ``CudaPlatform.get_valid_backends`` for compute capability 9.0 and
  each model dtype (``--dtype``), each backend's own checks, then the chosen one's ``get_preferred_block_size``
  from vLLM's default 16 (a float32 model runs on Triton; no MLA backend takes one). What needs the CUDA
  build's kernels is stood in for as vLLM's CUDA wheels have them on Hopper: the extension module the CUDA
  platform imports, FlashAttention 3's extension (without which its package does not import, so whether a
  backend imported depended on which test ran first) and MLA support (``flash_attn_supports_mla``), and
  FlashMLA's dense kernels (``is_flashmla_dense_supported``). FlashInfer is not installed here: a backend that
  cannot be imported must not rank above the one chosen.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
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


FLASH_ATTN = ("vllm.vllm_flash_attn", "vllm.vllm_flash_attn.flash_attn_interface")
"""vLLM's FlashAttention package, which imports only with its CUDA extensions (FA3's on Hopper)."""


@pytest.fixture
def cuda_backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """vLLM's CUDA platform class, importable on this CPU, with Hopper's kernels stood in for; the modules that
    import only with the stand-ins are forgotten afterwards (another test's import fails as it would)."""
    stood_in = [m for m in ("vllm.platforms.cuda", "vllm.v1.attention.backends.mla.flashattn_mla",
                            "vllm.v1.attention.backends.mla.flashattn_mla_sparse", *FLASH_ATTN)
                if m not in sys.modules]
    yield _cuda_platform(monkeypatch)
    for name in stood_in:
        sys.modules.pop(name, None)


def _cuda_platform(monkeypatch: pytest.MonkeyPatch) -> Any:
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except ImportError:  # the CUDA build's extension needs libcuda: its symbols are not used here
        monkeypatch.setitem(sys.modules, "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    if FLASH_ATTN[0] not in sys.modules:  # its extensions need libcuda; a failed import may have left its interface
        monkeypatch.delitem(sys.modules, FLASH_ATTN[1], raising=False)
        monkeypatch.setitem(sys.modules, f"{FLASH_ATTN[0]}._vllm_fa3_C", types.ModuleType("_vllm_fa3_C"))
    from vllm.v1.attention.backends import fa_utils

    for kernel in ("flash_attn_varlen_func", "get_scheduler_metadata", "reshape_and_cache_flash"):
        monkeypatch.setattr(fa_utils, kernel, getattr(fa_utils, kernel, None), raising=False)
    cuda = importlib.import_module("vllm.platforms.cuda")
    flashattn_mla = importlib.import_module("vllm.v1.attention.backends.mla.flashattn_mla")
    monkeypatch.setattr(flashattn_mla, "flash_attn_supports_mla", lambda: True)  # FA3 on Hopper
    flashmla_ops = importlib.import_module("vllm.v1.attention.ops.flashmla")
    monkeypatch.setattr(flashmla_ops, "is_flashmla_dense_supported", lambda: (True, None))
    return cuda.CudaPlatform


def hopper_choice(platform: Any, use_mla: bool, head_size: int, kv_cache_dtype: str,
                  dtype: str = "bfloat16") -> tuple[str, int] | None:
    """(backend, block size) vLLM picks on compute capability 9.0 without --block-size for a model served in
    ``dtype``, or None when none fits."""
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    selector = AttentionSelectorConfig(head_size=head_size, dtype=getattr(torch, dtype), kv_cache_dtype=kv_cache_dtype,
                                       block_size=None, use_mla=use_mla)
    valid, invalid = platform.get_valid_backends(DeviceCapability(9, 0), selector)
    best = min(valid, key=lambda c: c.priority) if valid else None
    # A backend this machine cannot import must not outrank the choice, unless its class declares no support for
    # the model's dtype (read from its source); FlashInfer's MLA backend alone may (it declares compute
    # capability 10.x only, so Hopper never takes it).
    unknown = {b.name for b, (priority, reasons) in invalid.items()
               if any(r.startswith(("ImportError", "ModuleNotFoundError")) for r in reasons)
               and (best is None or priority < best.priority) and dtype in declared_dtypes(b.value)}
    assert unknown <= {"FLASHINFER_MLA"}, (unknown, best)
    if best is None:
        return None
    return best.backend.name, best.backend_class.get_preferred_block_size(16)


def declared_dtypes(class_path: str) -> set[str]:
    """The model dtypes a backend class declares (its ``supported_dtypes``), read from its module's source without
    importing it (what cannot be imported here: FlashInfer's backends); every dtype when it declares none."""
    import ast
    import importlib.util

    module, name = class_path.rsplit(".", 1)
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, class_path
    tree = ast.parse(Path(spec.origin).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "supported_dtypes":
            assert isinstance(node.value, ast.List), class_path
            return {e.attr for e in node.value.elts if isinstance(e, ast.Attribute)}
    return {"bfloat16", "float16", "float32"}


MODEL_DTYPES = ["bfloat16", "float16", "float32"]
"""What ``--dtype`` resolves to (``model_dtype``)."""


@pytest.mark.parametrize("dtype", MODEL_DTYPES)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"])
def test_the_mla_block_size_is_the_hopper_backends(cuda_backends: Any, kv_cache_dtype: str, dtype: str) -> None:
    choice = hopper_choice(cuda_backends, True, 576, kv_cache_dtype, dtype)  # DeepSeek-V2/V3's latent + RoPE
    if choice is None:  # vLLM finds no backend: the plan refuses the launch
        with pytest.raises(ModelSpecError, match="none of vLLM's MLA backends for Hopper"):
            pf.check_attention_backend("cuda", "mla", kv_cache_dtype, "0.33.0", dtype)
        return
    pf.check_attention_backend("cuda", "mla", kv_cache_dtype, "0.33.0", dtype)
    assert choice[1] == mla_cuda_block_size(kv_cache_dtype), choice


@pytest.mark.parametrize("dtype", MODEL_DTYPES)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_the_standard_block_size_is_the_hopper_backends(cuda_backends: Any, kv_cache_dtype: str, head_size: int,
                                                        dtype: str) -> None:
    """FlashAttention, vLLM's first choice for a 16-bit model and cache on Hopper: 16 (fp8 may go to FlashInfer,
    absent here); a float32 model, which neither FlashAttention nor FlashInfer takes: Triton's, 16 too."""
    pf.check_attention_backend("cuda", "standard", kv_cache_dtype, "0.33.0", dtype)
    backend = "TRITON_ATTN" if dtype == "float32" else "FLASH_ATTN"
    assert hopper_choice(cuda_backends, False, head_size, kv_cache_dtype, dtype) == (backend, 16)
