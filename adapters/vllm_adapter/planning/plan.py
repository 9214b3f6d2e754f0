"""``kvpolicy plan --engine vllm``: what vLLM would allocate for a model and a budget.

The arithmetic is vLLM 0.33's; 0.32.0 plans the same (it has DeepSeek-V4 too): checked against a
real vLLM 0.32.0 CPU engine in tests/vllm_e2e, and its planning functions over random DeepSeek-V4
layer patterns in tests/vllm_e2e/test_vllm_plan_v4_032.py.

Pure code on top of ``hf_config`` and ``kv_cache_planning``; ``VllmPlan`` is the JSON
that ``kvpolicy plan --engine vllm --format json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from ..pools import PADDING_POOL
from ..versions import NEWEST_VALIDATED_VLLM
from .deepseek_v4_032 import check_v4_config_032
from .field_kinds import check_field_kinds
from .hf_config import Family, ModelSpecs, SpecSettings, model_dtype, model_family, model_specs
from .kv_dtype import kv_dtype
from .load_order import check_config_load, kinds_first
from .quant_config import quantization
from .max_len import check_max_model_len, model_length
from .quant_method import check_quant_method
from .platform import Platform, check_attention_backend, check_kv_cache_dtype
from .kv_cache_planning import (
    Group,
    KVCacheLayout,
    PlanError,
    blocks_per_request,
    bytes_per_block,
    check_fits,
    kv_cache_groups,
    num_blocks_for_budget,
    validate_layout,
)

PLAN_SCHEMA: Final = 1


class PlanSettings(SpecSettings):
    """vLLM launch settings that change the plan (vLLM's flag names)."""

    max_model_len: PositiveInt
    """--max-model-len."""
    kv_cache_layout: str | None = None
    """VLLM_KV_CACHE_LAYOUT; default: BLHNC for DeepSeek-V4 (its backends declare it), else LBNHC."""
    max_num_batched_tokens: PositiveInt = 8192
    """--max-num-batched-tokens (vLLM's server default on Hopper GPUs of 70 to 160 GiB)."""
    max_concurrent_batches: PositiveInt = 2
    """Batches in flight: 2 with async scheduling (vLLM's default), else the PP size."""
    allow_long_max_model_len: bool | None = None
    """VLLM_ALLOW_LONG_MAX_MODEL_LEN: a max_model_len above the config's is refused unless set
    (None: read the variable, as vLLM does)."""

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_concurrent_batches * self.max_num_batched_tokens


class GroupPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    block_size: PositiveInt
    bytes_per_block: NonNegativeInt
    """Bytes one block of this group holds (the sum of its layers' pages)."""
    padding_per_block: NonNegativeInt
    """The rest of a pool block this group holds: the pool's bytes_per_block − this group's."""
    layers: PositiveInt
    pools: list[str]
    pool_bytes_per_block: dict[str, NonNegativeInt]
    blocks_per_request: NonNegativeInt


class PoolPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    bytes_per_block: NonNegativeInt
    """The pool's bytes in one block of every group that holds its layers: the sum of the page bytes
    of all its layers across those groups (V4-Flash ``swa``: 823,680 + 786,240 B)."""
    groups: list[NonNegativeInt]
    per_request_bytes: NonNegativeInt
    """The pool's bytes held by one request at max_model_len."""
    parts: dict[str, NonNegativeInt] = Field(default_factory=dict)
    """Per part, its share of ``bytes_per_block``, summed the same way (DeepSeek-V4 compressor state: c4,
    c128, indexer); the parts add up to ``bytes_per_block``."""


class RequestPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    blocks: NonNegativeInt
    bytes: NonNegativeInt


class VllmPlan(BaseModel):
    """The plan JSON (schema 1). ``total_bytes`` is the backing buffer vLLM allocates per rank."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    schema_: Literal[1] = Field(default=PLAN_SCHEMA, alias="schema")
    engine: Literal["vllm"] = "vllm"
    engine_version: str = NEWEST_VALIDATED_VLLM
    model: Family
    kv_cache_layout: str
    budget: NonNegativeInt | None
    bytes_per_block: PositiveInt
    num_blocks: PositiveInt
    total_bytes: NonNegativeInt
    max_model_len: PositiveInt
    groups: list[GroupPlan]
    pools: dict[str, PoolPlan]
    per_request: RequestPlan
    max_concurrency: float
    """num_blocks / blocks per request, as vLLM logs it ("Maximum concurrency")."""
    kv_cache_size_tokens: NonNegativeInt
    """int(max_concurrency × max_model_len), as vLLM logs it ("KV cache size")."""
    assumed: dict[str, str] = Field(default_factory=dict)
    """The defaults the plan assumed where no flag said (name → value and where it comes from)."""

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def default_layout(specs: ModelSpecs) -> KVCacheLayout:
    return KVCacheLayout.BLHNC if specs.family == "deepseek_v4" else KVCacheLayout.LBNHC


def make_plan(
    config: Mapping[str, Any],
    settings: PlanSettings,
    *,
    budget: int | None = None,
    num_blocks: int | None = None,
    engine_version: str = NEWEST_VALIDATED_VLLM,
    platform: Platform = "cuda",
) -> VllmPlan:
    """The plan for a budget in bytes (``kv_cache_memory_bytes``) or a block count
    (``num_gpu_blocks_override``); exactly one of them. Raises PlanError (the budget) or ModelSpecError (the
    config or a setting) when vLLM ``engine_version`` would refuse on ``platform``, in the order vLLM checks:
    as transformers loads the config, a field of a kind its config class refuses, a dtype name it cannot read,
    a fault of the keys every config class reads for itself (``base_keys``) and the RoPE parameters (in its
    order: ``load_order``); then the keys 0.32's DeepSeek-V4 model needs and the quantization config (as it
    loads the config), the model dtype, max_model_len, the quantization method (known, not deprecated), the KV
    dtype (as it resolves ``--kv-cache-dtype`` for the checkpoint, ``kv_dtype``), the tensor parallel size and
    the heads, the quantization config and the model dtype its kernels take, then as a worker builds the model
    its embedding, layers, attention backend and KV quantization (``model_build``); the budget. The kinds of
    the fields are checked after the plan's checks of what it reads, whose messages say more, but named first
    wherever one of those refuses another field (``kinds_first``)."""
    if (budget is None) == (num_blocks is None):
        raise PlanError("give exactly one of a budget or a number of blocks")
    check_config_load(config, engine_version)
    with kinds_first(config, engine_version):
        check_v4_config_032(config, engine_version)
        quantization(config, engine_version)
        dtype = model_dtype(config, settings.dtype)
        check_max_model_len(model_length(config), settings.max_model_len, settings.allow_long_max_model_len)
        check_quant_method(config, engine_version)
        family = model_family(config)
        kv = kv_dtype(config, settings.kv_cache_dtype, family)
        check_kv_cache_dtype(config, kv.cache, engine_version, settings.dtype)
        specs = model_specs(config, settings, on_attention=lambda: check_attention_backend(
            platform, family, kv.layers, engine_version, dtype, kv))
    check_field_kinds(config, engine_version)
    layout = KVCacheLayout.from_name(settings.kv_cache_layout) if settings.kv_cache_layout else default_layout(specs)
    groups = kv_cache_groups(specs.layers, layout)
    validate_layout(groups, layout)
    block_bytes = bytes_per_block(groups, layout)
    blocks = num_blocks_for_budget(budget, block_bytes) if budget is not None else num_blocks
    assert blocks is not None
    in_flight = settings.max_in_flight_tokens
    request_blocks = blocks_per_request(groups, settings.max_model_len, in_flight)
    check_fits(
        budget if budget is not None else blocks * block_bytes,
        block_bytes,
        lambda model_len: blocks_per_request(groups, model_len, in_flight),
        settings.max_model_len,
    )
    concurrency = blocks / request_blocks
    return VllmPlan(
        engine_version=engine_version,
        model=specs.family,
        kv_cache_layout=layout.name,
        budget=budget,
        bytes_per_block=block_bytes,
        num_blocks=blocks,
        total_bytes=blocks * block_bytes,
        max_model_len=settings.max_model_len,
        groups=[_group_plan(g, block_bytes, settings) for g in groups],
        pools=_pool_plans(groups, settings),
        per_request=RequestPlan(blocks=request_blocks, bytes=request_blocks * block_bytes),
        max_concurrency=concurrency,
        kv_cache_size_tokens=int(concurrency * settings.max_model_len),
    )


def _group_plan(g: Group, block_bytes: int, s: PlanSettings) -> GroupPlan:
    pools = g.pool_bytes()
    return GroupPlan(
        kind=g.kind.value,
        block_size=g.block_size,
        bytes_per_block=g.page_bytes,
        padding_per_block=block_bytes - g.page_bytes,
        layers=len(g.layers),
        pools=list(pools),
        pool_bytes_per_block=pools,
        blocks_per_request=g.blocks_per_request(s.max_model_len, s.max_in_flight_tokens),
    )


def _pool_plans(groups: list[Group], s: PlanSettings) -> dict[str, PoolPlan]:
    acc: dict[str, dict[str, Any]] = {}
    for i, g in enumerate(groups):
        request_blocks = g.blocks_per_request(s.max_model_len, s.max_in_flight_tokens)
        parts = g.part_bytes()
        for pool, nbytes in g.pool_bytes().items():
            assert pool and pool != PADDING_POOL, f"layer spec without a pool in group {i}"
            entry = acc.setdefault(pool, {"bytes_per_block": 0, "groups": [], "per_request_bytes": 0, "parts": {}})
            entry["bytes_per_block"] += nbytes
            entry["groups"].append(i)
            entry["per_request_bytes"] += request_blocks * nbytes
            for part, pbytes in parts.get(pool, {}).items():
                entry["parts"][part] = entry["parts"].get(part, 0) + pbytes  # summed as the pool's bytes
    return {name: PoolPlan(**entry) for name, entry in acc.items()}


__all__ = ["PlanError", "PlanSettings", "VllmPlan", "make_plan"]
