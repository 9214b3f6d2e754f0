"""vLLM 0.33's own KV planning, run on a CPU: the reference the adapter is tested against.

Builds a real ``VllmConfig`` from a local config.json (no weights), constructs the
real model class on the ``meta`` device so that its attention modules run their own
``get_kv_cache_spec``, and plans with ``get_global_kv_cache_groups`` /
``get_kv_cache_configs``. Import only from tests marked ``vllm`` (it imports vllm).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from tests.support.network import free_loopback_port
from tests.vllm.vllm_paths import CONFIGS


@dataclass(frozen=True)
class Case:
    """One model and the vLLM settings it is planned with."""

    name: str
    block_size: int
    max_model_len: int = 32768
    kv_cache_dtype: str = "auto"
    layout: str = "LBNHC"
    indexer_kv_dtype: str = "fp8"
    sliding_window_block_size: int | None = None
    """What vLLM's CPU attention backend picks for sliding-window layers (MultipleOf(32))."""
    max_num_batched_tokens: int = 8192
    tensor_parallel_size: int = 1
    """The specs are one rank's of this many (``layer_specs`` builds the model as rank 0)."""
    dtype: str = "auto"
    """--dtype."""

    @property
    def config_dir(self) -> Path:
        return CONFIGS / self.name

    @property
    def id(self) -> str:
        return (f"{self.name}-b{self.block_size}-{self.layout}-{self.kv_cache_dtype}-{self.indexer_kv_dtype}"
                f"-tp{self.tensor_parallel_size}" + (f"-{self.dtype}" if self.dtype != "auto" else ""))


class _CpuEvent:
    """Stands in for torch.cuda.Event, which DeepSeek-V4's attention creates at
    construction and a CPU build of torch cannot (no kernel is launched here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


@functools.cache
def vllm_config(case: Case) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    kwargs: dict[str, Any] = {}
    if case.indexer_kv_dtype != "fp8":
        kwargs["attention_config"] = {"indexer_kv_dtype": case.indexer_kv_dtype}
    if case.tensor_parallel_size > 1:  # config only: no worker is started
        kwargs |= {"tensor_parallel_size": case.tensor_parallel_size, "distributed_executor_backend": "mp"}
    args = EngineArgs(
        model=str(case.config_dir),
        skip_tokenizer_init=True,
        load_format="dummy",
        max_model_len=case.max_model_len,
        kv_cache_dtype=case.kv_cache_dtype,
        block_size=case.block_size,
        max_num_batched_tokens=case.max_num_batched_tokens,
        dtype=case.dtype,
        **kwargs,
    )
    return args.create_engine_config()


_distributed = False


def _init_distributed(cfg: Any) -> None:
    global _distributed
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import destroy_model_parallel, get_ep_group

    if _distributed:
        # vLLM makes the expert-parallel group only when the config current at set-up is a MoE
        # model's: a process that first set up for a dense model must set up again for a MoE one
        # (which file a test process runs first depends on how the suite is split).
        if cfg.model_config.is_moe:
            try:
                get_ep_group()
            except AssertionError:
                with set_current_vllm_config(cfg):
                    destroy_model_parallel()
                    initialize_model_parallel(1, 1)
        return

    port = free_loopback_port()
    with set_current_vllm_config(cfg):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
        )
        initialize_model_parallel(1, 1)
    _distributed = True


@functools.cache
def layer_specs(case: Case) -> dict[str, Any]:
    """Every KV cache layer's real spec, in the order vLLM's model runner lists them."""
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader import get_model_architecture

    cfg = vllm_config(case)
    _init_distributed(cfg)
    from vllm.platforms import current_platform

    saved_event = torch.cuda.Event
    torch.cuda.Event = _CpuEvent  # type: ignore[misc,assignment]
    platform_cls = type(current_platform)
    saved_family = platform_cls.__dict__.get("is_device_capability_family")
    if case.indexer_kv_dtype == "mxfp4":
        # The MXFP4 indexer cache needs a Blackwell datacenter GPU (sm_10x): say this is one.
        platform_cls.is_device_capability_family = classmethod(lambda cls, family, device_id=0: family == 100)
    try:
        with set_current_vllm_config(cfg), _tensor_parallel_rank(case.tensor_parallel_size):
            model_cls, _ = get_model_architecture(cfg.model_config)
            with torch.device("meta"):
                model_cls(vllm_config=cfg, prefix="")
            layers = get_layers_from_vllm_config(cfg, AttentionLayerBase)
            specs = {name: layer.get_kv_cache_spec(cfg) for name, layer in layers.items()}
    finally:
        torch.cuda.Event = saved_event  # type: ignore[misc]
        if case.indexer_kv_dtype == "mxfp4":
            if saved_family is None:
                del platform_cls.is_device_capability_family
            else:
                platform_cls.is_device_capability_family = saved_family
    return {name: spec for name, spec in specs.items() if spec is not None}


@contextlib.contextmanager
def _tensor_parallel_rank(size: int) -> Iterator[None]:
    """Let the model classes see rank 0 of a tensor-parallel group of ``size`` while they build (on the meta
    device nothing is communicated: only the sizes they split by change). test_vllm_tensor_parallel.py checks
    the same split with two real ranks in a gloo world."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    saved = group.world_size, group.rank_in_group
    group.world_size, group.rank_in_group = size, 0
    try:
        yield
    finally:
        group.world_size, group.rank_in_group = saved


@dataclass
class RealPlan:
    config: Any  # VllmConfig
    groups: list[Any]  # KVCacheGroupSpec
    kv_cache_config: Any  # KVCacheConfig of the one rank

    @property
    def bytes_per_block(self) -> int:
        return self.kv_cache_config.kv_cache_tensors[0].size // self.kv_cache_config.num_blocks

    @property
    def max_concurrency(self) -> float:
        from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

        return get_max_concurrency_for_kv_cache_config(self.config, self.kv_cache_config)


def real_plan(case: Case, budget: int) -> RealPlan:
    """vLLM's own plan for one rank with ``budget`` bytes (``kv_cache_memory_bytes``)."""
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    cfg = vllm_config(case)
    specs = dict(layer_specs(case))
    cfg.cache_config.kv_cache_layout = case.layout
    groups = get_global_kv_cache_groups(cfg, [specs])
    (config,) = get_kv_cache_configs(cfg, [specs], [budget], groups)
    return RealPlan(cfg, groups, config)


def scheduler_block_sizes(kv_cache_config: Any) -> tuple[int, int]:
    sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
    lcm = math.lcm(*sizes)
    return lcm, lcm


# DeepSeek-V4 layer specs by compression ratio, from one real model build.
V4_TEMPLATE_RATIOS = (0, 4, 128, 4, 0, 128)
"""The pattern the template model is built with: every ratio, twice, in two orders."""


def v4_template_config(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a DeepSeek-V4 config.json) shrunk where the KV cache does not look (hidden size,
    experts, vocabulary) so the meta-device build is quick, with the template's layers and a 1M context."""
    return {
        **base,
        "num_hidden_layers": len(V4_TEMPLATE_RATIOS),
        "compress_ratios": [*V4_TEMPLATE_RATIOS, 0],  # the last entry is the MTP layer's
        "max_position_embeddings": 1 << 20,
        "vocab_size": 512, "hidden_size": 256, "moe_intermediate_size": 64, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "q_lora_rank": 64, "o_lora_rank": 64,
    }


def v4_layer_templates(case: Case) -> dict[int, list[tuple[str, Any]]]:
    """Per compression ratio, the (name suffix, real spec) of one layer's KV caches, in the order
    vLLM's modules register them, read off a real model built from ``case`` (a V4 template config).

    Checks on the way that reassembling the template's own pattern gives back the real model's
    specs exactly (names, order, specs), so ``v4_specs`` builds what vLLM would for any pattern."""
    real = layer_specs(case)
    by_layer: dict[int, list[tuple[str, Any]]] = {}
    for name, spec in real.items():
        parts = name.split(".")  # model.layers.N.attn...
        by_layer.setdefault(int(parts[2]), []).append((".".join(parts[3:]), spec))
    templates: dict[int, list[tuple[str, Any]]] = {}
    for i, ratio in enumerate(V4_TEMPLATE_RATIOS):
        templates.setdefault(ratio, by_layer[i])
    rebuilt = v4_specs(templates, list(V4_TEMPLATE_RATIOS))
    assert list(rebuilt.items()) == list(real.items()), "layer specs depend on more than the layer's ratio"
    return templates


def v4_specs(templates: dict[int, list[tuple[str, Any]]], ratios: list[int]) -> dict[str, Any]:
    """The real specs of a V4 model with these per-layer ratios, in vLLM's registration order."""
    return {f"model.layers.{i}.{suffix}": spec for i, r in enumerate(ratios) for suffix, spec in templates[r]}


def real_plan_for_specs(cfg: Any, specs: dict[str, Any], budget: int, layout: str) -> RealPlan:
    """``real_plan`` for given specs (vLLM's planning only; no model is built)."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    cfg.cache_config.kv_cache_layout = layout
    groups = get_global_kv_cache_groups(cfg, [specs])
    (config,) = get_kv_cache_configs(cfg, [specs], [budget], groups)
    return RealPlan(cfg, groups, config)


def max_request_bytes(cfg: Any, groups: list[Any]) -> int:
    """vLLM's worst case for one request at max_model_len (``_max_memory_usage_bytes_from_groups``)."""
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
    from vllm.v1.core.kv_cache_planning import _max_memory_usage_bytes_from_groups

    return _max_memory_usage_bytes_from_groups(get_kv_cache_config_builder(cfg), cfg, groups)


def allocated_views(kv_cache_config: Any, layout: str) -> dict[str, Any]:
    """What vLLM's own ``allocate_kv_cache`` builds for ``kv_cache_config``, on the ``meta`` device (shapes,
    strides and offsets, no memory): the backing buffer's bytes and, per layer, its group, its blocks,
    its block stride, where its page starts in a block and the bytes its data spans there (all in bytes).
    Plain JSON, so a probe under another vLLM can print it."""
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    views = allocate_kv_cache(kv_cache_config, torch.device("meta"), KVCacheLayout[layout])
    group_of = {name: i for i, g in enumerate(kv_cache_config.kv_cache_groups) for name in g.layer_names}
    buffers = {v.untyped_storage().nbytes() for v in views.values()}
    assert len(buffers) == 1, "vLLM allocates one backing buffer per rank"
    layers = {}
    for name, view in views.items():
        size = view.element_size()
        layers[name] = {
            "group": group_of[name],
            "blocks": view.shape[0],
            "block_stride": view.stride(0) * size,
            "start": view.storage_offset() * size,
            "extent": (1 + sum((n - 1) * s for n, s in zip(view.shape[1:], view.stride()[1:]))) * size,
        }
    return {"buffer_bytes": buffers.pop(), "layers": layers}
