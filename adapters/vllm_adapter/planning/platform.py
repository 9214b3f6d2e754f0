"""What vLLM's platform decides for a launch that a flag did not: block size and the scheduler's batch figures.

``kvpolicy plan --engine vllm --platform cuda|cpu`` plans what a default ``vllm serve`` resolves to
on that platform (vLLM 0.32.0 and 0.33.0 agree on all of it):

- **cuda** (the default; a GPU of 70 GB or more, not an A100, as vLLM's defaults distinguish them):
  the attention backends' block size (16; FlashMLA 64; DeepSeek-V4 256), 8192 batched tokens
  (the server's default on such GPUs), async scheduling on, so 2 batches in flight.
- **cpu** (``vllm/platforms/cpu.py``): block size 128, 16 for MLA on the reference CPU kernel
  (no AMX), 256 for DeepSeek-V4 (both forced even over --block-size); 2048 × TP batched tokens
  (the server's CPU default); async scheduling off, so 1 batch in flight; and for MLA models
  without AMX (DeepSeek-V4 included) chunked prefill off, so a batch holds
  max(max_model_len, 2048) tokens, whatever --max-num-batched-tokens says.

Pure (no torch, no vllm); tests/vllm_e2e checks the CPU figures against a real vLLM 0.32 resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .hf_config import Family

Platform = Literal["cuda", "cpu"]

CUDA_BATCHED_TOKENS = 8192  # OPENAI_API_SERVER on GPUs of >= 70 GB (not A100)
CPU_BATCHED_TOKENS = 2048  # OPENAI_API_SERVER on CPU, per TP rank
SCHEDULER_DEFAULT_BATCHED_TOKENS = 2048  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
CPU_BLOCK_SIZE, CPU_MLA_BLOCK_SIZE, V4_BLOCK_SIZE = 128, 16, 256


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
        return Resolved(None, "what vLLM's CUDA attention backends pick for this model")
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
                   tensor_parallel_size: int) -> Resolved:
    if chunked_prefill_off(platform, family, amx):
        return Resolved(
            max(max_model_len, SCHEDULER_DEFAULT_BATCHED_TOKENS),
            "vLLM's CPU platform turns chunked prefill off for MLA without AMX: max(max_model_len, 2048)",
            forced=True,
        )
    if asked is not None:
        return Resolved(asked, "--max-num-batched-tokens")
    if platform == "cpu":
        return Resolved(CPU_BATCHED_TOKENS * tensor_parallel_size, "vLLM's server default on CPU: 2048 x TP")
    return Resolved(CUDA_BATCHED_TOKENS, "vLLM's server default on GPUs of 70 GB or more")


def concurrent_batches(platform: Platform, asked: int | None) -> Resolved:
    if asked is not None:
        return Resolved(asked, "--max-concurrent-batches")
    if platform == "cpu":
        return Resolved(1, "vLLM's CPU platform turns async scheduling off")
    return Resolved(2, "vLLM's async scheduling (on by default)")
