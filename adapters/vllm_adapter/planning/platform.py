"""What vLLM's platform decides for a launch that a flag did not: block size and the scheduler's batch figures.

``kvpolicy plan --engine vllm --platform cuda|cpu`` plans what a default ``vllm serve`` resolves to
on that platform (vLLM 0.32.0 and 0.33.0 agree on all of it):

- **cuda** (the default): a plan cannot see the GPU, so it assumes the class vLLM's defaults
  single out: a Hopper GPU (compute capability 9.0) of 70 to 160 GiB, i.e. an H100 or H200 —
  the attention backends' block size (16; MLA 16 on FlashAttention's MLA, 64 with an fp8 cache
  on FlashMLA; DeepSeek-V4 256), 8192 batched tokens (the server's default on such GPUs), async
  scheduling on, so 2 batches in flight. An MXFP4 DeepSeek-V4 indexer runs only on Blackwell
  datacenter GPUs (vLLM refuses it elsewhere), all of 160 GiB or more (B200, GB200, B300), where
  the server's default is 16384 batched tokens: so such a plan assumes one.
- **cpu** (``vllm/platforms/cpu.py``): block size 128, 16 for MLA on the reference CPU kernel
  (no AMX), 256 for DeepSeek-V4 (both forced even over --block-size); 2048 × TP batched tokens
  (the server's CPU default); async scheduling off, so 1 batch in flight; and for MLA models
  without AMX (DeepSeek-V4 included) chunked prefill off, so a batch holds
  max(max_model_len, 2048) tokens, whatever --max-num-batched-tokens says.

A default batch is never more than the default number of sequences × max_model_len (vLLM's cap for
short models). Pure (no torch, no vllm); tests/vllm_e2e checks the CPU figures against a real vLLM 0.32
resolution, tests/vllm against 0.33's, and tests/vllm/test_vllm_cuda_defaults.py the CUDA backend choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvpolicy.document_codes import LAUNCH_REFUSED

from ...hf_dtype import dtype_key
from .hf_config import Family, ModelSpecError, model_dtype
from .kv_dtype import KvDtype

Platform = Literal["cuda", "cpu"]

CPU_BATCHED_TOKENS = 2048  # OPENAI_API_SERVER on CPU, per TP rank
CPU_MAX_NUM_SEQS = 128  # OPENAI_API_SERVER on CPU, per TP rank
SCHEDULER_DEFAULT_BATCHED_TOKENS = 2048  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
CPU_BLOCK_SIZE, CPU_MLA_BLOCK_SIZE, V4_BLOCK_SIZE = 128, 16, 256
CPU_MLA_KV_DTYPES = ("auto", "bfloat16", "float16")
"""What vLLM 0.33's CPU MLA attention takes (0.32 does not check, and its kernels take only auto)."""


@dataclass(frozen=True)
class CudaGpu:
    """The GPU class a CUDA plan assumes, and the server defaults vLLM gives it."""

    name: str
    batched_tokens: int  # OPENAI_API_SERVER's max_num_batched_tokens
    max_num_seqs: int  # OPENAI_API_SERVER's max_num_seqs


HOPPER = CudaGpu("a Hopper GPU of 70 to 160 GiB (H100, H200)", 8192, 1024)
BLACKWELL = CudaGpu("a Blackwell datacenter GPU of 160 GiB or more (B200, GB200, B300), the only GPUs on which "
                    "vLLM runs the MXFP4 indexer", 16384, 1024)


def cuda_gpu(indexer_kv_dtype: str = "fp8") -> CudaGpu:
    """The GPU class a CUDA plan assumes: Hopper, unless only Blackwell can run the launch."""
    return BLACKWELL if indexer_kv_dtype == "mxfp4" else HOPPER


@dataclass(frozen=True)
class Resolved:
    """One setting as the platform resolves it, and why (for the plan's ``assumed``)."""

    value: int | None
    """None: the model's attention backends decide (CUDA block sizes, see hf_config)."""
    why: str
    forced: bool = False
    """The platform overrides the flag too."""


def block_size(platform: Platform, family: Family, asked: int | None, amx: bool) -> Resolved:
    if platform == "cuda":
        if asked is not None:
            return Resolved(asked, "--block-size")
        return Resolved(None, "what vLLM's CUDA attention backends pick for this model on Hopper")
    if family == "deepseek_v4":
        return Resolved(V4_BLOCK_SIZE, "vLLM's CPU platform forces it for DeepSeek-V4", forced=True)
    if family == "mla" and not amx:
        return Resolved(CPU_MLA_BLOCK_SIZE, "vLLM's CPU platform forces it for MLA without AMX", forced=True)
    if asked is not None:
        return Resolved(asked, "--block-size")
    return Resolved(CPU_BLOCK_SIZE, "vLLM's CPU platform default")


def chunked_prefill_off(platform: Platform, family: Family, amx: bool) -> bool:
    """vLLM's CPU platform turns chunked prefill off for MLA models unless AMX kernels run them."""
    return platform == "cpu" and family in ("mla", "deepseek_v4") and not amx


def batched_tokens(platform: Platform, family: Family, asked: int | None, amx: bool, max_model_len: int,
                   tensor_parallel_size: int, gpu: CudaGpu = HOPPER) -> Resolved:
    if chunked_prefill_off(platform, family, amx):
        return Resolved(
            max(max_model_len, SCHEDULER_DEFAULT_BATCHED_TOKENS),
            "vLLM's CPU platform turns chunked prefill off for MLA without AMX: max(max_model_len, 2048)",
            forced=True,
        )
    if asked is not None:
        return Resolved(asked, "--max-num-batched-tokens")
    if platform == "cpu":
        default, seqs = CPU_BATCHED_TOKENS * tensor_parallel_size, CPU_MAX_NUM_SEQS * tensor_parallel_size
        why = "vLLM's server default on CPU: 2048 x TP"
    else:
        default, seqs = gpu.batched_tokens, gpu.max_num_seqs
        why = f"vLLM's server default on {gpu.name}"
    if seqs * max_model_len < default:  # vLLM caps a default batch at its sequences' whole length
        return Resolved(seqs * max_model_len, f"{why}, capped at {seqs} sequences x max_model_len")
    return Resolved(default, why)


def concurrent_batches(platform: Platform, asked: int | None) -> Resolved:
    if asked is not None:
        return Resolved(asked, "--max-concurrent-batches")
    if platform == "cpu":
        return Resolved(1, "vLLM's CPU platform turns async scheduling off")
    return Resolved(2, "vLLM's async scheduling (on by default)")


def check_kv_cache_dtype(config: Mapping[str, Any], kv_cache_dtype: str, version: str, dtype: str = "auto") -> None:
    """Refuse a 16-bit KV cache dtype other than the model's (``--dtype``, as vLLM resolves it), as vLLM 0.33 does
    when it builds its config (``VllmConfig._reject_mismatched_float_kv_cache``; 0.32 takes it); ModelSpecError."""
    served = model_dtype(config, dtype)
    if kv_cache_dtype in ("float16", "bfloat16") and kv_cache_dtype != served and not version.startswith("0.32."):
        use = f"auto or {served}" if served in ("float16", "bfloat16") else "auto"
        # The config's dtype is what the flag does not fit, unless --dtype chose another.
        key = dtype_key(config) if dtype == "auto" else None
        raise ModelSpecError(
            f"--kv-cache-dtype {kv_cache_dtype}: vLLM {version} serves this model in {served} and refuses a "
            f"16-bit KV cache of another dtype; use {use}",
            (key,) if key else None, LAUNCH_REFUSED,
        )


HOPPER_MLA_BACKENDS = "FlashAttention MLA, FlashMLA, Triton MLA"
"""vLLM's MLA backends that run on compute capability 9.0, in its order of preference (``CudaPlatform``; FlashInfer's
MLA backend, listed between FlashMLA and Triton, takes compute capability 10.x only)."""


def check_attention_backend(platform: Platform, family: Family, kv_cache_dtype: str, version: str,
                            dtype: str = "bfloat16", kv: KvDtype | None = None) -> None:
    """Refuse a launch none of the platform's MLA attention backends takes, as vLLM does when it builds the model's
    attention layers (``get_attn_backend``: no valid backend); ``kv_cache_dtype`` is what the layers store
    (``kv``: how vLLM resolved the flag to it, ``kv_dtype``), ``dtype`` the model's as vLLM serves it
    (``model_dtype``); ModelSpecError."""
    if family != "mla":
        return
    shown, key = (kv.shown, kv.key) if kv is not None else (f"--kv-cache-dtype {kv_cache_dtype}", None)
    if platform == "cpu" and kv_cache_dtype not in CPU_MLA_KV_DTYPES and not version.startswith("0.32."):
        fix = "drop --kv-cache-dtype" if kv is None or kv.flag != "auto" else f"pass --kv-cache-dtype {dtype}"
        raise ModelSpecError(
            f"{shown}: vLLM {version}'s MLA attention on CPU takes auto, bfloat16 or float16 only, and refuses the "
            f"launch; {fix}", key, LAUNCH_REFUSED,
        )
    if platform != "cuda":
        return
    if dtype == "float32":
        raise ModelSpecError(
            f"--dtype {dtype}: none of vLLM's MLA backends for Hopper ({HOPPER_MLA_BACKENDS}) takes a float32 "
            "model, so vLLM finds no attention backend; use --dtype bfloat16, float16 or auto"
        )
    if kv_cache_dtype == "fp8_e5m2":
        raise ModelSpecError(
            f"{shown}: none of vLLM's MLA backends for Hopper ({HOPPER_MLA_BACKENDS}) takes fp8_e5m2, so vLLM "
            "finds no attention backend; use fp8 (e4m3)", key, LAUNCH_REFUSED,
        )
