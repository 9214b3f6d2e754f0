"""Helpers for the SGLang DeepSeek-V4 tests: real sglang 0.5.23 objects on CPU."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace as NS

HERE = Path(__file__).parent
REPO = HERE.parent.parent
MODELS = REPO / "policies" / "models"


TINY_RATIOS = (0, 0, 4, 128, 4, 128, 4, 0)  # 7 target layers + 1 MTP layer, V4-shaped

RANDOM_EXAMPLES = int(os.environ.get("KVPOLICY_SGLANG_RANDOM_EXAMPLES", "150"))
"""How many random configs the engine-equality tests draw (the launch and rope tests a share of it);
raise it for a longer search: ``KVPOLICY_SGLANG_RANDOM_EXAMPLES=3000``."""


@contextmanager
def single_process_parallel() -> Iterator[None]:
    """SGLang's parallel context for one process (no world group), as its own tests set it."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(world_group=NS(cpu_group=None)):
        yield


@contextmanager
def published_server_args(**fields) -> Iterator[object]:
    """Publish SGLang server args (CPU, page 256, fp8 KV, no CUDA graphs unless given); restore after."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.runtime_context import get_context

    fields.setdefault("page_size", 256)
    fields.setdefault("kv_cache_dtype", "fp8_e4m3")
    fields.setdefault("device", "cpu")
    fields.setdefault("mem_fraction_static", 0.9)
    fields.setdefault("cuda_graph_config", CudaGraphConfig(
        decode=PhaseConfig(backend=Backend.DISABLED), prefill=PhaseConfig(backend=Backend.DISABLED)))
    override = get_context().override_server_args(**fields)
    try:
        yield override.install()
    finally:
        override.restore()


@contextmanager
def published_resolution(server_args) -> Iterator[object]:
    """Publish a really resolved ``ServerArgs`` (``prepare_server_args(...).resolve_once()``) as SGLang's
    launcher does; restore the previous context after."""
    from sglang.srt.runtime_context import get_context

    with published_server_args():  # saves the current context; restoring it drops ours too
        get_context().set_server_args(server_args)
        yield server_args


def dsv4_model_config(geometry):
    """The ModelConfig fields SGLang's DSV4 configurator and pool builder read, from a geometry."""
    hf = NS(architectures=["DeepseekV4ForCausalLM"], kv_source_layer_ids=list(geometry.kv_source_layer_ids))
    return NS(
        hf_config=hf,
        hf_text_config=hf,
        qk_nope_head_dim=geometry.qk_nope_head_dim,
        qk_rope_head_dim=geometry.qk_rope_head_dim,
        head_dim=geometry.head_dim,
        index_head_dim=geometry.index_head_dim,
        context_len=geometry.max_position_embeddings,
        compress_ratios=list(geometry.compress_ratios),
        window_size=geometry.sliding_window,
        is_multimodal=False,
    )


def kv_cache_configurator(geometry, server_args_obj, *, gpu_id=0, draft=False, model_config=None):
    """A real ``KVCacheConfigurator`` for a DeepSeek-V4 target on CPU, of ``geometry`` or, given instead, of a real
    ``ModelConfig`` (its layers and sliding window too).

    Built with ``object.__new__`` and its fields set, as SGLang's own tests stub it:
    ``__init__`` wants a loaded model; every method the V4 sizing and pool paths run
    is the real one.
    """
    import torch
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if model_config is None:
        model_config, layers, window = dsv4_model_config(geometry), geometry.num_hidden_layers, geometry.sliding_window
    else:
        layers, window = model_config.num_hidden_layers, model_config.sliding_window_size
    kvc = object.__new__(KVCacheConfigurator)
    fields = dict(
        device="cpu", gpu_id=gpu_id, attn_dp_size=1, pp_size=1, pp_group=None, model=None,
        model_config=model_config, server_args=server_args_obj,
        kv_cache_dtype=torch.float8_e4m3fn, model_dtype=torch.bfloat16, page_size=256,
        sliding_window_size=window, spec_algorithm=SpeculativeAlgorithm.NONE,
        is_draft_worker=draft, post_capture_kv_active=False, spec_aux_config=None, is_hybrid_swa=True,
        is_hybrid_swa_compress=False, use_mla_backend=False,
        layer_info=NS(start_layer=0, end_layer=layers, num_effective_layers=layers),
        forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
        memory_pool_config=None, draft_parallel_layout=None, dflash_draft_cell_size_per_token=None,
        draft_model_idx=None, kv_cache_dtype_str="fp8_e4m3", extra_mamba_cache_bytes_per_req=0,
        mambaish_config=None, hybrid_gdn_config=None, hybrid_kda_config=None, kv_shard_rank=None,
        kv_shard_size=1, kv_shard_spec=None, kv_shard_group=None, is_hybrid_swa_mtp_draft=False,
        draft_swa_full_capacity=False,
    )
    for name, value in fields.items():
        setattr(kvc, name, value)
    return kvc


@dataclass
class BuiltPools:
    """What ``build_pools_through_sglang`` made: SGLang's config and sizes, the request table, the V4 pool."""

    config: object
    sizes: object
    req_to_token_pool: object
    pool: object


def build_pools_through_sglang(kvc, pre_model_load_memory_gb=80.0) -> BuiltPools:
    """What ``KVCacheConfigurator.configure`` does for a V4 target: profile → config → pools.

    Runs the real ``_resolve_memory_pool_config`` (which calls ``_profile_available_bytes``,
    hooked or not), ``_derive_pool_sizes``, the real ``_build_req_to_token_pool`` (on
    ``kvc.device``, as ``_init_pools`` does) and ``_build_dsv4_kv_pool``.
    """
    config = kvc._resolve_memory_pool_config(pre_model_load_memory_gb)
    sizes = kvc._derive_pool_sizes(config=config)
    return BuiltPools(config, sizes, *build_from_sizes(kvc, sizes))


def build_from_sizes(kvc, sizes):
    """The request table and the V4 pool SGLang builds for ``sizes`` (``_init_pools`` for a V4 target)."""
    req_pool = kvc._build_req_to_token_pool(max_num_reqs=sizes.max_running_requests)
    pool = kvc._build_dsv4_kv_pool(
        max_running_requests=sizes.max_running_requests,
        full_max_total_num_tokens=sizes.full_max_total_num_tokens,
        swa_max_total_num_tokens=sizes.swa_max_total_num_tokens,
        c4_max_total_num_tokens=sizes.c4_max_total_num_tokens,
        c128_max_total_num_tokens=sizes.c128_max_total_num_tokens,
        c4_state_pool_size=sizes.c4_state_pool_size,
        c128_state_pool_size=sizes.c128_state_pool_size,
        c4_state_dtype=sizes.c4_state_dtype,
        c128_state_dtype=sizes.c128_state_dtype,
        req_to_token_pool=req_pool,
    )
    return req_pool, pool


def real_sizes(kvc, budget):
    """What SGLang's own configurator makes of ``budget`` (the steps of ``_resolve_memory_pool_config``)."""
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    config = kvc.config_from_budget(budget)
    config.max_running_requests = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
    return create_memory_pool_configurator(kvc).finalize_with_max_running_requests(config)


def real_tensors(kvc, config) -> list[tuple[str, int]]:
    """(policy pool, bytes) of each tensor SGLang allocates for ``config`` on ``kvc.device``, in
    allocation order: the request-to-token table, then the V4 pool's tensors."""
    from kvpolicy.adapters.sglang_dsv4.facts import _recognised
    from kvpolicy.adapters.sglang_dsv4.plan import REQ_TO_TOKEN

    req_pool, pool = build_from_sizes(kvc, kvc._derive_pool_sizes(config=config))
    return [(REQ_TO_TOKEN, req_pool.req_to_token.nbytes)] + [
        (name, t.nbytes) for name, _part, _where, t in _recognised(pool)
    ]


def build_pool_through_sglang(kvc, pre_model_load_memory_gb=80.0):
    """``build_pools_through_sglang`` as (config, sizes, V4 pool)."""
    built = build_pools_through_sglang(kvc, pre_model_load_memory_gb)
    return built.config, built.sizes, built.pool


def tensor_bytes_by_pool(pool, req_to_token_pool=None) -> dict[str, int]:
    """Sums of the real tensors' bytes per policy pool, read straight off SGLang's objects
    (independently of facts.py); a pool the config has no layer for is absent."""
    sums = {"swa": sum(t.nbytes for t in pool.swa_kv_pool.kv_buffer)}
    for ratio, name in ((4, "c4"), (128, "c128")):
        if pool.kv_pools.get(ratio) is not None:
            sums[name] = sum(t.nbytes for t in pool.kv_pools[ratio].kv_buffer)
    if pool.index_pools.get(4) is not None:
        sums["indexer"] = sum(t.nbytes for t in pool.index_pools[4].index_k_with_scale_buffer)
    states = [p for p in [*pool.compress_state_pools, *pool.indexer_compress_state_pools] if p is not None]
    if states:
        sums["compressor_state"] = sum(p.kv_score_buffer.kv_score.nbytes for p in states)
    if req_to_token_pool is not None:
        sums["req_to_token"] = req_to_token_pool.req_to_token.nbytes
    return sums


@contextmanager
def gpu_memory_is(mib: float) -> Iterator[None]:
    """What SGLang's ``get_device_memory_capacity`` answers (nvidia-smi's memory.total on CUDA), in MiB."""
    from unittest import mock

    import sglang.srt.arg_groups.memory_hook as memory_hook

    with mock.patch.object(memory_hook, "get_device_memory_capacity", lambda device=None: mib):
        yield


def resolve_for_real(model_dir, hardware, argv: list[str]):
    """SGLang's own resolution of ``sglang serve --model-path DIR ARGV`` on ``hardware`` (a launch.Hardware),
    on this machine's CPU with the GPU memory SGLang would read stubbed."""
    from sglang.srt.server_args import prepare_server_args

    with gpu_memory_is(hardware.gpu_memory_mib):
        args = prepare_server_args(
            ["--model-path", str(model_dir), "--device", "cpu", "--tp-size", str(hardware.tp_size), *argv]
        )
        args.resolve_once()
    return args


def engine_reading(server_args, device: str = "meta"):
    """With ``server_args`` published: (what the adapter's hooks read, the KV dtype, a configurator on the
    real ``ModelConfig`` of the resolution, SGLang's reading of the config alone)."""
    from kvpolicy.adapters.sglang_dsv4 import hooks
    from sglang.srt.arg_groups.overrides import model_config_of, resolution_result

    kvc = kv_cache_configurator(None, server_args, model_config=model_config_of(server_args))
    kvc.attn_dp_size = resolution_result(server_args, "attn_dp_size")
    kvc.page_size = resolution_result(server_args, "page_size")
    kvc.device = device
    return hooks.live_settings(kvc), resolution_result(server_args, "kv_cache_dtype"), kvc
