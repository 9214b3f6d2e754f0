"""The hooks in SGLang 0.5.23, installed by ``install`` (imports sglang).

- ``KVCacheConfigurator._profile_available_bytes`` (the budget): instead of the
  free memory at start-up, hand the DeepSeek-V4 configurator the largest budget
  for which the real V4 pools *and* the request-to-token table fit the model's
  policy ``reserve``, after the ledger admitted that reserve on this GPU. SGLang
  allocates the table (``ReqToTokenPool``: requests + 1 rows of context + 4 int32
  entries) outside the budget it gives the configurator, so the closed forms price
  it with the pools (``plan.budget_for_reserve``): the footprint of table + pools,
  in allocation order on the caching allocator, is what must fit the reserve.
- ``KVCacheConfigurator._build_dsv4_kv_pool`` (the facts): measure the pool just
  built and the request table it is handed, per policy pool (the table as
  ``req_to_token``), set the pool's ``mem_usage``, check the total fits what was
  admitted, and report it to the ledger.
- ``KVCacheConfigurator._build_token_to_kv_pool_allocator`` (the elastic SWA pool's
  allocator): bind the allocator SGLang builds over an elastic SWA pool.

With ``pool swa { owner elastic }`` (tensor parallel 1) the budget hook plans the SWA
pool on the allocator and opens an elastic ledger session, the pool hook builds the
SWA tensors over it, and the allocator hook binds SGLang's SWA allocator to it
(``elastic_wiring``). All wrap the original and change nothing for non-V4 models or
draft workers.
Anything the adapter cannot do correctly is an ``AdapterError`` at start-up; the
ledger's refusals become one here, with the policy line of the reserve
(``ledger_port.as_startup_failure``), and nowhere else.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpolicy.runtime.gpus import gpu_id
from kvpolicy.runtime.session import RankGroup
from kvpolicy.units import format_bytes

from ..collective import process_group_ranks
from ..common import require_attr
from ..errors import AdapterError
from ..ledger_port import as_startup_failure
from ..settings import DEFAULT_GIVE_BACK_CHUNKS
from . import elastic_wiring as wiring
from . import plan as closed
from .elastic import ElasticSWA, swa_backed_by
from .elastic_policy import check_tensor_parallel
from .facts import PoolMeasurement, measure_pool, with_elastic_swa
from .geometry import ModelGeometry
from .ports import Connector, ElasticLedgerSession, InstanceIdentity, LedgerSession, Reserve, ReserveSource

# SGLang's objects (the configurator ``kvc``, its pools, the methods patched) are Any: SGLang
# ships no types; the pinned version's classes are what the tests run the hooks against.

logger = logging.getLogger("kvpolicy.adapters.sglang_dsv4")

CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
BUDGET_HOOK = f"{CONFIGURATOR}._profile_available_bytes"
POOL_HOOK = f"{CONFIGURATOR}._build_dsv4_kv_pool"
ALLOCATOR_HOOK = f"{CONFIGURATOR}._build_token_to_kv_pool_allocator"
_MARK = "__kvpolicy_hook__"
GB = 1 << 30


@dataclass
class Admitted:
    identity: InstanceIdentity
    session: LedgerSession
    reserve: closed.Plan | None
    admitted: int
    reserve_where: str
    elastic: closed.ElasticPool | None = None
    """The SWA pool on the allocator, when the policy marks it elastic."""


@dataclass
class AdapterState:
    """What the hooks of this process share: how to reach the policy and the ledger, and what was admitted."""

    reserve_source: ReserveSource
    connect: Connector
    model_name: str | None = None
    """KVPOLICY_MODEL; None: SGLang's served model name."""
    give_back_chunks: int | None = DEFAULT_GIVE_BACK_CHUNKS
    """KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS: chunks an elastic SWA pool unmaps per tick at most (None: no bound);
    the environment's default where the caller does not say."""
    admitted: dict[int, Admitted] = field(default_factory=dict)  # by GPU id
    measurements: list[PoolMeasurement] = field(default_factory=list)
    elastic_pools: list[tuple[object, ElasticSWA]] = field(default_factory=list)
    """(SGLang's V4 pool, its elastic SWA pool) for each pool built with one."""

    def elastic_swa_of(self, pool: object) -> ElasticSWA | None:
        return next((swa for p, swa in self.elastic_pools if p is pool), None)


HOOKS = (
    ("_profile_available_bytes", BUDGET_HOOK),
    ("_build_dsv4_kv_pool", POOL_HOOK),
    ("_build_token_to_kv_pool_allocator", ALLOCATOR_HOOK),
)


def install(state: AdapterState) -> list[str]:
    """Patch the hook points; a missing one is an ``AdapterError`` naming it. Idempotent."""
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    cls = require_attr(mod, "KVCacheConfigurator", BUDGET_HOOK)
    installed = []
    wrappers = {BUDGET_HOOK: _budget_hook, POOL_HOOK: _pool_hook, ALLOCATOR_HOOK: _allocator_hook}
    for name, hook in HOOKS:
        wrapper = wrappers[hook]
        current = require_attr(cls, name, hook)
        box = getattr(current, _MARK, None)
        if box is not None:  # already ours: point it at the new state
            box["state"] = state
        else:
            setattr(cls, name, _patched(wrapper, current, state))
        installed.append(hook)
    return installed


def uninstall() -> None:
    """Put the originals back (tests)."""
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    cls = mod.KVCacheConfigurator
    for name, _ in HOOKS:
        box = getattr(cls.__dict__.get(name), _MARK, None)
        if box is not None:
            setattr(cls, name, box["original"])


def _patched(wrapper: Callable[..., Any], original: Callable[..., Any], state: AdapterState) -> Callable[..., Any]:
    box = {"state": state, "original": original}

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(self, original, box["state"], *args, **kwargs)

    setattr(method, _MARK, box)  # lets install() and uninstall() recognise their own patch
    return method


def _is_target_v4(kvc: Any) -> bool:
    from sglang.srt.configs.model_config import is_deepseek_v4

    return is_deepseek_v4(kvc.model_config.hf_config) and not kvc.is_draft_worker


def _budget_hook(
    kvc: Any, original: Callable[..., Any], state: AdapterState, pre_model_load_memory: Any, *args: Any, **kwargs: Any
) -> Any:
    if not _is_target_v4(kvc):
        return original(kvc, pre_model_load_memory, *args, **kwargs)
    unsupported = unsupported_settings(kvc)
    if unsupported:
        raise AdapterError(
            "kvpolicy: the DeepSeek-V4 budget hook is validated for SGLang's default CUDA path only; "
            "this engine runs with: " + "; ".join(unsupported) + ". Launch without these settings, "
            "or unset KVPOLICY_ENABLE to run SGLang unbudgeted."
        )
    geometry, settings = live_geometry(kvc), live_settings(kvc)
    model = state.model_name or _served_model_name()
    reserve = state.reserve_source(model)
    swa_policy = _resolved_swa_policy(reserve, gpu_id(kvc.gpu_id)) if reserve.swa_elastic else None
    if not reserve.bytes:
        raise AdapterError(
            f"kvpolicy: model {model!r} has no `reserve` in {reserve.where}. DeepSeek-V4's pools are "
            f"sized from it: add e.g. `reserve 40 GiB` to the model block that binds {model!r}."
        )
    free = original(kvc, pre_model_load_memory, *args, **kwargs)  # what SGLang would have used
    try:
        chosen = closed.budget_for_reserve(geometry, settings, reserve.bytes, swa_policy)
    except closed.PlanError as exc:
        raise AdapterError(f"kvpolicy: reserve {format_bytes(reserve.bytes)} at {reserve.where}: {exc}") from None
    if chosen.total_footprint > free:
        raise AdapterError(
            f"kvpolicy: reserve {format_bytes(reserve.bytes)} at {reserve.where} needs "
            f"{format_bytes(chosen.total_footprint)} of KV pools and request table on cuda:{kvc.gpu_id}, but "
            f"after weights and SGLang's runtime slack only {format_bytes(free)} ({free} B) is free. Lower the "
            "reserve, or raise --mem-fraction-static."
        )
    _cross_check_configurator(kvc, chosen, settings)
    identity = InstanceIdentity(model=model, gpu=gpu_id(kvc.gpu_id), rank=_tp_rank())
    elastic = chosen.elastic.get("swa")
    with as_startup_failure(f"policy: reserve {format_bytes(reserve.bytes)} at {reserve.where}"):
        if elastic is None:
            session = state.connect(identity)
        else:  # an elastic instance, owed the SWA pool's guarantee; the reserve covers the rest
            session = state.connect(identity, guarantee=elastic.guarantee, elastic=True)
        ranks = _engine_ranks()  # None at TP 1 (an elastic SWA pool is refused above TP 1)
        admitted = session.admit_static(reserve.bytes) if ranks is None else session.admit_static_group(reserve.bytes, ranks)
    state.admitted[kvc.gpu_id] = Admitted(identity, session, chosen, admitted, reserve.where, elastic)
    logger.info(
        "kvpolicy: admitted %s on %s for %s (%s); DeepSeek-V4 budget %d B -> %d full tokens, "
        "pools %s (footprint %s); SGLang alone would have used %s",
        format_bytes(admitted), identity.gpu, model, reserve.where, chosen.budget, chosen.tokens.full,
        format_bytes(chosen.total_bytes), format_bytes(chosen.total_footprint), format_bytes(free),
    )
    if elastic is not None:
        logger.info(
            "kvpolicy: elastic SWA pool: %d pages x %d layers, %s reserved, %s pinned, guarantee %s, max %s",
            elastic.pages, elastic.layers, format_bytes(elastic.virtual), format_bytes(elastic.pinned),
            format_bytes(elastic.guarantee), format_bytes(elastic.limit),
        )
    return chosen.budget


def _resolved_swa_policy(reserve: Reserve, gpu: str) -> closed.SWAElasticPolicy:
    """The policy's elastic SWA pool on ``gpu``; TP > 1 is refused loudly (each rank would map its pages on its
    own while one scheduler admits requests for all)."""
    check_tensor_parallel(_tp_size())
    if reserve.swa_policy is None:
        raise AdapterError(f"kvpolicy: the policy source for {reserve.model!r} cannot resolve its elastic SWA pool")
    return reserve.swa_policy(gpu)


def _pool_hook(kvc: Any, original: Callable[..., Any], state: AdapterState, *args: Any, **kwargs: Any) -> Any:
    if kvc.is_draft_worker:
        return original(kvc, *args, **kwargs)
    entry = state.admitted.get(kvc.gpu_id)
    if entry is None:
        raise AdapterError(
            f"kvpolicy: a DeepSeek-V4 pool is being built on cuda:{kvc.gpu_id} without passing the budget hook "
            f"({BUDGET_HOOK}); it is not sized by the policy. This SGLang code path is not supported."
        )
    swa: ElasticSWA | None = None
    if entry.elastic is None:
        pool = original(kvc, *args, **kwargs)
    else:
        name = f"{entry.identity.instance_id}-swa"
        if not isinstance(entry.session, ElasticLedgerSession):
            raise AdapterError(f"kvpolicy: the ledger session of {name} has no limit source for an elastic pool")
        driver = wiring.driver_for(kvc.device, kvc.gpu_id, entry.elastic)
        make = wiring.maker(entry.session, entry.elastic, driver, name, give_back_chunks=state.give_back_chunks)
        with swa_backed_by(make) as made:
            pool = original(kvc, *args, **kwargs)
        swa = wiring.check_built(made, entry.elastic)
    m = measure_pool(pool, kwargs.get("req_to_token_pool"), elastic_swa=swa is not None)
    state.measurements.append(m)
    held = swa.held_bytes if swa is not None else 0
    pool.mem_usage = (m.pool_tensor_bytes + held) / GB  # SGLang's kv_cache_memory_usage_gb reads it (0 otherwise)
    footprint = m.footprint + (swa.pinned if swa is not None else 0)  # the runtime-owned part
    if footprint > entry.admitted:
        if swa is not None:
            swa.close()
        raise AdapterError(
            f"kvpolicy: the DeepSeek-V4 pools and request table take {format_bytes(footprint)} "
            f"({footprint} B) on {entry.identity.gpu}, more than the {format_bytes(entry.admitted)} "
            f"({entry.admitted} B) "
            f"admitted for reserve at {entry.reserve_where}. Refusing to run over the policy."
        )
    predicted = entry.reserve.total_bytes - (entry.elastic.tensor_bytes if entry.elastic is not None else 0) \
        if entry.reserve is not None else None
    if predicted is not None and m.tensor_bytes != predicted:
        logger.warning(
            "kvpolicy: the DeepSeek-V4 pools hold %d bytes, the closed forms predicted %d; the ledger "
            "gets the measured figures.", m.tensor_bytes, predicted,
        )
    facts = m.facts
    if swa is not None:
        static, session = m.facts, entry.session
        facts = with_elastic_swa(static, swa.facts())
        swa.on_report = lambda: session.report_pools(with_elastic_swa(static, swa.facts()))
        state.elastic_pools.append((pool, swa))
    with as_startup_failure(f"reporting the DeepSeek-V4 pools of {entry.identity.instance_id}"):
        entry.session.report_pools(facts)
    logger.info(
        "kvpolicy: DeepSeek-V4 pools on %s: %s", entry.identity.gpu,
        ", ".join(f"{k} {format_bytes(v.bytes)}{' (elastic, mapped)' if v.owner == 'elastic' else ''}"
                  for k, v in facts.items()),
    )
    return pool


def _allocator_hook(kvc: Any, original: Callable[..., Any], state: AdapterState, *args: Any, **kwargs: Any) -> Any:
    allocator = original(kvc, *args, **kwargs)
    swa = state.elastic_swa_of(kwargs.get("token_to_kv_pool"))
    if swa is not None:
        wiring.bind_allocator(allocator, swa)
        logger.info("kvpolicy: SGLang's SWA allocator hands out pages of %r", swa)
    return allocator


def unsupported_settings(kvc: Any) -> list[str]:
    """The engine settings that take SGLang off the path the closed forms are validated on."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.dsv4.unified_kv_gate import is_unified_kv_triton
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import select_dsv4_kv_layout
    from sglang.srt.runtime_context import get_disagg, get_exec, get_memory, get_spec

    found = []
    if get_spec().speculative_algorithm is not None:
        found.append(f"speculative decoding ({get_spec().speculative_algorithm})")
    if kvc.pp_size != 1:
        found.append(f"pipeline parallel (pp_size={kvc.pp_size})")
    if get_memory().enable_hisparse:
        found.append("--enable-hisparse")
    if get_memory().enable_unified_memory:
        found.append("unified memory pool")
    if get_exec().features.enable_encoder_swa_bounded_replay:
        found.append("encoder SWA bounded replay")
    if get_disagg().disaggregation_mode == "decode":
        found.append("PD disaggregation decode role")
    if is_unified_kv_triton():
        found.append("unified_kv (HIP)")
    if get_exec().kernel.dsv4_attn_backend == "trtllm":
        found.append("--dsv4-attn-backend trtllm")
    layout, option = select_dsv4_kv_layout()
    if layout.value != "v4" or option not in (None, "auto", "fp8"):
        found.append(f"KV layout {layout.value} (SGLANG_DSV4_KV_LAYOUT)")
    dtype = envs.SGLANG_DSV4_COMPRESS_STATE_DTYPE.get().strip().lower()
    if dtype not in ("float32", "fp32"):
        found.append(f"SGLANG_DSV4_COMPRESS_STATE_DTYPE={dtype}")
    if envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get():
        found.append("SGLANG_OPT_USE_ONLINE_COMPRESS=1")
    if list(getattr(kvc.model_config.hf_config, "kv_source_layer_ids", []) or []):
        found.append("ratio-1/2 kv_source layers (V4.1)")
    ratios = set(kvc.model_config.compress_ratios) - {0, 4, 128}
    if ratios:
        found.append(f"compress ratios {sorted(ratios)}")
    return found


def live_geometry(kvc: Any) -> ModelGeometry:
    """The model's V4 geometry as this configurator sees it (its PP stage, its window)."""
    mc = kvc.model_config
    info = kvc.layer_info
    ratios = list(mc.compress_ratios)
    return ModelGeometry(
        num_hidden_layers=info.end_layer - info.start_layer,
        head_dim=mc.qk_nope_head_dim + mc.qk_rope_head_dim,
        qk_rope_head_dim=mc.qk_rope_head_dim,
        index_head_dim=mc.index_head_dim,
        sliding_window=kvc.sliding_window_size,
        compress_ratios=tuple(ratios[info.start_layer :]),
        max_position_embeddings=mc.context_len,
    )


def live_settings(kvc: Any) -> closed.PlanSettings:
    """The launch settings the closed forms need, read from SGLang's published config."""
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_memory, get_schedule

    sched = get_schedule()
    explicit_ratio = bool(getattr(sched, "_swa_full_tokens_ratio_explicitly_set", False))
    return closed.PlanSettings(
        page_size=sched.page_size,
        max_running_requests=sched.max_running_requests,
        swa_ratio=sched.swa_full_tokens_ratio if explicit_ratio else None,
        context_length=kvc.model_config.context_len,
        chunked_prefill_size=sched.chunked_prefill_size if sched.chunked_prefill_size is not None else -1,
        max_total_tokens=sched.max_total_tokens,
        attn_dp_size=kvc.attn_dp_size,
        disable_radix_cache=bool(get_memory().disable_radix_cache),
        disable_overlap_schedule=bool(sched.disable_overlap_schedule),
        swa_prefix_tails=sched.swa_prefix_tails,
        swa_eviction_interval=max(1, envs.SGLANG_SWA_EVICTION_INTERVAL.get()),
    )


def _cross_check_configurator(kvc: Any, chosen: closed.Plan, settings: closed.PlanSettings) -> None:
    """SGLang's own configurator must pick the token counts the closed forms predict for this budget."""
    import logging as _logging

    from sglang.srt.model_executor.pool_configurator import (
        create_memory_pool_configurator,
    )

    sglang_log = _logging.getLogger("sglang.srt.model_executor.pool_configurator")
    level = sglang_log.level
    sglang_log.setLevel(_logging.WARNING)  # its sizing log line is for the real call, not this one
    try:
        real = create_memory_pool_configurator(kvc).calculate_pool_sizes(chosen.budget, settings.page_size)
    finally:
        sglang_log.setLevel(level)
    full = real.max_total_num_tokens
    if settings.max_total_tokens is not None and settings.max_total_tokens < full:
        full = settings.max_total_tokens // settings.page_size * settings.page_size
        ok = chosen.tokens.full == full
    else:
        ok = (full, real.swa_max_total_num_tokens, real.c4_max_total_num_tokens, real.c128_max_total_num_tokens) == (
            chosen.tokens.full, chosen.tokens.swa, chosen.tokens.c4, chosen.tokens.c128,
        )
    if not ok:
        raise AdapterError(
            f"kvpolicy: SGLang's DeepSeek-V4 configurator sizes a {chosen.budget} B budget as full="
            f"{real.max_total_num_tokens} swa={real.swa_max_total_num_tokens} c4={real.c4_max_total_num_tokens} "
            f"c128={real.c128_max_total_num_tokens}; the adapter's closed forms say {chosen.tokens}. "
            "The adapter cannot guarantee the reserve on this configuration."
        )


def _served_model_name() -> str:
    from sglang.srt.runtime_context import get_server_args

    args = get_server_args()
    name = getattr(args, "served_model_name", None) or getattr(args, "model_path", None)
    if not name:
        raise AdapterError("kvpolicy: cannot tell the model's name; set KVPOLICY_MODEL to its policy name")
    return str(name)


def _engine_ranks() -> RankGroup | None:
    """The engine's ranks, admitted all or none (tensor parallel > 1): SGLang's world group; None for one."""
    if _tp_size() == 1:
        return None
    try:
        from sglang.srt.distributed.parallel_state import get_world_group

        ranks = process_group_ranks(get_world_group())
    except (AssertionError, AttributeError, ImportError) as exc:
        raise AdapterError(
            f"kvpolicy: tensor parallel {_tp_size()} but SGLang's world group is not there ({exc!r}); the ranks' "
            "reserves must be admitted together. This SGLang code path is not supported."
        ) from None
    return ranks


def _tp_size() -> int:
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().tp_size)
    except (AttributeError, RuntimeError, ValueError):
        return 1  # single-process use (tests, offline tools)


def _tp_rank() -> int:
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().tp_rank)
    except (AttributeError, RuntimeError, ValueError):
        return 0  # single-process use (tests, offline tools): rank 0
