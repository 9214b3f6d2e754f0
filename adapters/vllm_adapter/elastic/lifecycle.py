"""The elastic KV cache's life in one engine process, step by step, called from ``hooks``.

In the order they run in one engine process (engine core and its one worker):

1. ``prepare_engine`` (``EngineCore._initialize_kv_caches``, before it): if the policy
   marks this model's pools elastic, ask vLLM for a layout the elastic pool can back
   and the attention backends accept (``layouts.choose_layout``: ``BLHNC`` where it is
   accepted, else e.g. ``LBHNC`` on the CPU backend) through ``VLLM_KV_CACHE_LAYOUT``.
2. ``plan_worker`` (``Worker.determine_available_memory``, before it): open the rank's
   ledger session as an elastic instance (guarantee = the model's ``min``) and set
   ``kv_cache_memory_bytes`` to the model's ``max`` — vLLM then plans that many
   blocks, as address space only.
3. ``elastic_allocation`` / ``allocate`` (``Worker.initialize_from_config``, around it):
   admit the null block's chunks statically, build the ``ElasticKVBuffer``, and let the
   model runner (V1's or the default Model Runner V2) run vLLM's own
   ``allocate_kv_cache`` inside the buffer's allocation context (in a layer-outermost
   layout, with the layer regions widened to whole chunks: ``layouts.BufferGeometry``).
4. ``bind_manager`` (``KVCacheManager.__init__``, after it): the scheduler's block pool
   gets an ``ElasticPool`` beside it, over that buffer.
5. ``after_step`` (``EngineCore.step`` / ``step_with_batch_queue``, after each): the
   elastic pool's ``on_step`` (mirror, limits, give back, activity).

With the ``mp`` executor (tensor parallel ranks, each worker in its own process) steps 2
and 3 run in every rank, which then keeps a ``rank.RankMapper`` instead of offering its
buffer; after the KV caches are allocated the engine core offers its executor
(``offer_ranks``), and step 4 binds the scheduler's pool to the books of the ranks'
buffers (``group.group_buffer``), which reach the ranks through vLLM's ``collective_rpc``
running ``rank_call`` on each.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpolicy.adapters.common import read_policy
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.ledger_port import gpu_capacity
from kvpolicy.adapters.settings import AdapterEnv, VllmEnv
from kvpolicy.runtime.session import EngineSession

from ..identity import InstanceKey
from ..ledger import attach_elastic
from ..pools import PoolLayout, elastic_pool_facts
from .buffer import (
    ElasticKVBuffer,
    allocation_context,
    check_views,
    has_unbound,
    publish,
    take_unbound,
    unbound,
)
from .layouts import ELASTIC_LAYOUTS, choose_layout
from .policy import (
    ElasticSettings,
    check_kv_cache_config,
    check_parallel,
    elastic_settings,
    in_process,
    marked_pools,
)
from .rank import RankMapper
from .wire import RankAnswer, RankRequest

logger = logging.getLogger(__name__)

PLAN_ATTR = "_kvpolicy_elastic"
"""The worker attribute that holds its ``ElasticPlan`` from sizing on."""


@dataclass
class ElasticPlan:
    """One worker's elastic KV cache, from sizing to allocation (kept on the worker and its model runner)."""

    key: InstanceKey
    gpu: str
    settings: ElasticSettings
    session: EngineSession
    buffer: ElasticKVBuffer | None = None
    layout: PoolLayout | None = None
    ranks: RankMapper | None = None
    """With the ``mp`` executor: what the engine core's calls do on this rank's buffer (``rank``)."""


def plan_of(worker: Any) -> ElasticPlan | None:
    """The worker's elastic plan, or None when its KV cache is runtime-owned (or not sized yet)."""
    return getattr(worker, PLAN_ATTR, None)


# ---------------------------------------------------------------- engine core


def model_is_elastic(env: AdapterEnv, model: str) -> bool:
    """Whether the policy marks any pool of ``model`` ``owner elastic``."""
    from kvpolicy.policy.resolve import model_settings

    if env.policy is None:
        return False
    return bool(marked_pools(model_settings(read_policy(env.policy), model).pools)[0])


def prepare_engine(
    vllm_config: Any,
    model: str,
    supported_layouts: Callable[[], Sequence[Sequence[str]]] | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> bool:
    """Before vLLM resolves the KV cache layout: if ``model`` is elastic, ask for a layout the elastic
    pool can back among those its workers' attention backends support (``supported_layouts``, vLLM's
    ``Executor.get_supported_kv_cache_layouts``; None: BLHNC). True if the model is elastic."""
    env = AdapterEnv.from_environ()
    if not model_is_elastic(env, model):
        return False
    environ = os.environ if environ is None else environ
    configured = getattr(vllm_config.cache_config, "kv_cache_layout", None)
    requested = environ.get("VLLM_KV_CACHE_LAYOUT") or None
    for source, layout in (("--kv-cache-layout", configured), ("VLLM_KV_CACHE_LAYOUT", requested)):
        if layout is not None and str(getattr(layout, "name", layout)) not in ELASTIC_LAYOUTS:
            raise AdapterError(
                f"kvpolicy: {source}={getattr(layout, 'name', layout)}, but {model!r} has an elastic KV cache, which "
                f"needs one of the layouts {', '.join(ELASTIC_LAYOUTS)} (docs/vllm.md, \"Layouts\")."
            )
    if configured is None and requested is None:
        supported = list(supported_layouts()[0]) if supported_layouts is not None else None
        chosen = choose_layout(supported)
        if chosen is None:
            raise AdapterError(
                f"kvpolicy: {model!r} has an elastic KV cache, but its attention backends accept only the KV cache "
                f"layouts {', '.join(supported or ())}, none of which the elastic pool can back "
                f"({', '.join(ELASTIC_LAYOUTS)}). Use another attention backend, or mark the pools `owner runtime`."
            )
        environ["VLLM_KV_CACHE_LAYOUT"] = chosen
        logger.info("kvpolicy: %s has an elastic KV cache: VLLM_KV_CACHE_LAYOUT=%s (backends accept %s)",
                    model, chosen, supported)
    return True


_offered: list[tuple[Any, int]] = []
"""(executor, world size) of engine cores in this process whose elastic KV cache is in other processes."""


def offer_ranks(executor: Any, vllm_config: Any) -> None:
    """After the workers allocated their KV caches: with the ``mp`` executor the scheduler built next in
    this process keeps the books of the ranks' buffers (``bind_manager``). Nothing for ``uni``."""
    pc = vllm_config.parallel_config
    if not in_process(pc.world_size, pc.distributed_executor_backend):
        _offered.append((executor, pc.world_size))


def rank_call(worker: Any, request: dict[str, Any]) -> dict[str, Any]:
    """On a rank (vLLM's ``collective_rpc`` runs it with the worker): carry out one request of the core."""
    plan = plan_of(worker)
    if plan is None or plan.ranks is None:
        rank = getattr(worker, "rank", 0)
        return RankAnswer(rank=rank, gpu="", outcome="absent", detail="no elastic KV buffer on this rank").model_dump()
    return plan.ranks.handle(RankRequest.model_validate(request)).model_dump()


def executor_collective(executor: Any) -> Callable[[RankRequest], list[RankAnswer]]:
    """The core's one blocking call of every rank, through vLLM's ``collective_rpc``."""

    def call(request: RankRequest) -> list[RankAnswer]:
        return [RankAnswer.model_validate(a) for a in executor.collective_rpc(rank_call, args=(request.model_dump(),))]

    return call


def after_step(engine_core: Any) -> None:
    """After each engine step: the elastic pool's between-steps work (nothing for other engines)."""
    scheduler = getattr(engine_core, "scheduler", None)
    manager = getattr(scheduler, "kv_cache_manager", None)
    from .pool import elastic_of  # vLLM's block pool module: loaded by the scheduler by now

    elastic = elastic_of(getattr(manager, "block_pool", None))
    if elastic is not None:
        assert scheduler is not None  # the pool was found through it
        elastic.on_step(active=scheduler.has_requests())
        return
    if not has_unbound():
        return
    left = unbound()
    if left:  # a worker's buffer no scheduler adopted: its blocks would be handed out unmapped
        raise AdapterError(
            f"kvpolicy: {len(left)} elastic KV buffer(s) in this process were not adopted by the scheduler "
            "(the engine core's KVCacheManager was built elsewhere, or with another KV cache config); "
            "refusing to run steps that would use unmapped blocks."
        )


# ---------------------------------------------------------------- worker


def plan_worker(worker: Any, key: InstanceKey, gpu: str) -> ElasticPlan | None:
    """At sizing: the worker's elastic plan (ledger session opened, vLLM told to plan the virtual
    capacity, the plan kept on the worker), or None when the policy marks no pool of this model elastic."""
    env = AdapterEnv.from_environ()
    if not model_is_elastic(env, key.model):
        return None
    settings = elastic_settings(env.policy, key.model, gpu, gpu_capacity(gpu, env))
    assert settings is not None, "the policy marks elastic pools but gave no settings"
    pc = worker.parallel_config
    check_parallel(pc.world_size, pc.distributed_executor_backend, getattr(pc, "data_parallel_size", 1),
                   getattr(pc, "pipeline_parallel_size", 1))
    cache = worker.cache_config
    if cache.num_gpu_blocks_override is not None:
        raise AdapterError(
            f"kvpolicy: --num-gpu-blocks-override={cache.num_gpu_blocks_override} conflicts with the elastic KV "
            f"cache of {key.model!r}, which vLLM plans from the policy's max; remove the flag."
        )
    if cache.kv_cache_memory_bytes is not None and cache.kv_cache_memory_bytes != settings.virtual:
        raise AdapterError(
            f"kvpolicy: --kv-cache-memory-bytes={cache.kv_cache_memory_bytes} conflicts with the elastic KV cache "
            f"of {key.model!r} (planned from the policy's max, {settings.virtual} bytes); remove the flag."
        )
    if getattr(worker.vllm_config.model_config, "enable_sleep_mode", False):
        raise AdapterError("kvpolicy: sleep mode moves the KV cache itself; it cannot be combined with an elastic KV cache")
    if getattr(worker.vllm_config, "kv_transfer_config", None) is not None:
        raise AdapterError(
            "kvpolicy: KV connectors (--kv-transfer-config) place or transfer KV blocks themselves; "
            "they cannot be combined with an elastic KV cache in this version"
        )
    session = attach_elastic(key, gpu, settings.guarantee, env)
    cache.kv_cache_memory_bytes = settings.virtual
    logger.info(
        "kvpolicy: %s on %s: elastic KV cache, planned for %d bytes (max), guarantee %d bytes, chunk %d",
        key.id, gpu, settings.virtual, settings.guarantee, settings.chunk,
    )
    plan = ElasticPlan(key=key, gpu=gpu, settings=settings, session=session)
    setattr(worker, PLAN_ATTR, plan)
    return plan


def _driver_for(device: Any, plan: ElasticPlan, pinned: int, regions: int) -> Any:
    from kvpolicy.alloc import HostDriver, open_driver

    if getattr(device, "type", str(device)) == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        return open_driver("cuda", device=index)
    # vLLM on a CPU: shared-memory pages stand for the device's, as many as the cache can grow to
    # (its max, the pinned null-block chunks, and one chunk group of rounding).
    return HostDriver(capacity=plan.settings.virtual + pinned + plan.settings.chunk * regions)


@contextlib.contextmanager
def elastic_allocation(worker: Any, plan: ElasticPlan) -> Iterator[None]:
    """Around ``Worker.initialize_from_config``: the model runner's ``initialize_kv_cache`` (V1's
    ``GPUModelRunner`` or the default Model Runner V2 — both take ``kv_cache_allocation_context``)
    allocates inside the elastic buffer's allocation context. Set on that one runner, for the call."""
    runner = worker.model_runner
    initialize = runner.initialize_kv_cache
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(initialize).parameters
    except (TypeError, ValueError):
        params = {}
    if "kv_cache_allocation_context" not in params:
        raise AdapterError(
            f"kvpolicy: {type(runner).__name__}.initialize_kv_cache takes no kv_cache_allocation_context; this "
            "vLLM differs from the validated one, and its KV buffer cannot be put on the allocator"
        )

    def initialize_kv_cache(kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        if not kv_cache_config.kv_cache_tensors:  # attention-free: no buffer
            return initialize(kv_cache_config, *args, **kwargs)
        return allocate(worker, plan, initialize, kv_cache_config, *args, **kwargs)

    runner.initialize_kv_cache = initialize_kv_cache
    try:
        yield
    finally:
        del runner.initialize_kv_cache


def allocate(worker: Any, plan: ElasticPlan, initialize: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
    """The model runner's ``initialize_kv_cache``, with its one KV buffer on the allocator."""
    given = kwargs.get("kv_cache_allocation_context")
    if given is not None and not isinstance(given, contextlib.nullcontext):
        raise AdapterError(
            "kvpolicy: vLLM asked to allocate the KV cache in a memory pool (sleep mode or a KV connector); "
            "an elastic KV cache cannot live there"
        )
    layout_name = kv_cache_config.kv_cache_layout or worker.cache_config.get_resolved_kv_cache_layout().name
    geometry = check_kv_cache_config(
        kv_cache_config, str(getattr(layout_name, "name", layout_name)), plan.settings.runtime_pools
    )
    layout = PoolLayout.from_kv_cache_config(kv_cache_config)
    chunk = plan.settings.chunk
    pinned = geometry.pinned_chunks(chunk) * chunk
    admitted = plan.session.admit_static(pinned)  # runtime-owned: GPU figures measured here before a controller
    if admitted < pinned:
        raise AdapterError(f"kvpolicy: {plan.key.id}: only {admitted} of the {pinned} bytes for the null block were admitted")
    device = getattr(worker.model_runner, "device", None) or worker.device
    driver = _driver_for(device, plan, pinned, geometry.regions)
    grow_bytes = VllmEnv.from_environ().grow_bytes
    buffer = ElasticKVBuffer(
        driver,
        num_blocks=layout.num_blocks,
        bytes_per_block=layout.bytes_per_block,
        chunk=chunk,
        limit=plan.session.limit_source(),
        pinned=pinned,
        grow_chunks=max(1, grow_bytes // (chunk * geometry.regions)),
        name=f"{plan.key.id}-kv",
        regions=geometry.regions,
        block_stride=geometry.block_stride,
        give_back_chunks=AdapterEnv.from_environ().give_back_chunks,
    )
    try:
        context = allocation_context(buffer, device)
        kwargs["kv_cache_allocation_context"] = context
        # The worker's copy: layer regions widened to whole chunks; the scheduler keeps vLLM's config.
        result = initialize(geometry.widened(kv_cache_config, chunk), *args, **kwargs)
        if not context.served:
            raise AdapterError(
                f"kvpolicy: vLLM did not allocate its {buffer.size}-byte KV buffer through torch.zeros as "
                "0.33.0 does; this vLLM differs from the validated one"
            )
        forward = worker.vllm_config.compilation_config.static_forward_context
        check_views(buffer, {name: forward[name].kv_cache for g in kv_cache_config.kv_cache_groups for name in g.layer_names})
    except BaseException:
        buffer.close()
        raise
    plan.buffer, plan.layout = buffer, layout
    pc = worker.parallel_config
    if in_process(pc.world_size, pc.distributed_executor_backend):
        publish(buffer)
    else:  # the scheduler is in the engine core's process: it maps through this rank's RankMapper
        plan.ranks = RankMapper(buffer, rank=plan.key.rank, gpu=plan.gpu, block_stride=geometry.block_stride)
    plan.session.report_pools(elastic_pool_facts(layout, [0] * len(layout.groups), pinned))
    logger.info("kvpolicy: %s: %r", plan.key.id, buffer)
    return result


def report(plan: ElasticPlan, held: Any) -> None:
    """The rank's pools: the live split as elastic, the pinned chunks as runtime-owned ``padding``."""
    assert plan.buffer is not None and plan.layout is not None, "report before the elastic buffer exists"
    plan.session.report_pools(elastic_pool_facts(plan.layout, list(held), plan.buffer.pinned))


# ---------------------------------------------------------------- scheduler


def bind_manager(manager: Any, kv_cache_config: Any) -> Any:
    """If this process allocated an elastic buffer for this KV cache config, make the manager's pool elastic."""
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None)
    if not tensors or not kv_cache_config.num_blocks:
        return None
    buffer = take_unbound(kv_cache_config.num_blocks, tensors[0].size // kv_cache_config.num_blocks)
    if buffer is None and _offered:
        from .group import group_buffer

        executor, size = _offered.pop()
        buffer = group_buffer(executor_collective(executor), size,
                              refresh_interval=VllmEnv.from_environ().report_interval,
                              give_back_chunks=AdapterEnv.from_environ().give_back_chunks)
        if buffer.num_blocks != kv_cache_config.num_blocks:
            raise AdapterError(
                f"kvpolicy: the ranks' elastic KV buffers have {buffer.num_blocks} blocks, the scheduler plans "
                f"{kv_cache_config.num_blocks}: they come from different KV cache configs"
            )
    if buffer is None:
        return None
    from .pool import bind_scheduler

    on_activity = getattr(buffer.limit.inner, "touch", None)
    settings = VllmEnv.from_environ()
    pool = bind_scheduler(
        manager,
        buffer,
        give_back_interval=settings.give_back_interval,
        report_interval=settings.report_interval,
        yield_above_target=settings.yield_above_target,
        on_activity=on_activity,
    )
    logger.info("kvpolicy: the scheduler's block pool is elastic over %r", buffer)
    return pool
