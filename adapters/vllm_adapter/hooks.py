"""What each vLLM method the plugin patches runs: vLLM's own method, and around it the static or the elastic part.

Each ``*_hook(original)`` returns the replacement for one method (``plugin.install_hooks``
installs them). Where the model's KV cache is elastic (``elastic.lifecycle``) they
route there; otherwise to the runtime-owned path (``static``); the live reports
(``reports``) serve both. The two hooks that start a rank in the ledger (sizing, and
allocation with its first report) are the adapter's edge: there, and nowhere else, a
ledger refusal becomes the ``AdapterError`` that stops the start
(``ledger_port.as_startup_failure``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.ledger_port import as_startup_failure
from kvpolicy.adapters.settings import AdapterEnv

from .elastic import lifecycle as elastic
from .identity import instance_key, policy_model, worker_gpu
from .pools import PoolLayout
from .reports import LAYOUT_ATTR, EngineReporter, report_worker_pools
from .static.reserve import reserve_where
from .static.sizing import size_kv_cache

Method = Callable[..., Any]

REPORTER_ATTR = "_kvpolicy_reporter"
"""The engine core attribute that holds its ``EngineReporter`` (none for attention-free models)."""


def size_worker_cache(worker: Any) -> int:
    """The bytes vLLM sizes this worker's KV cache with: the policy's ``max`` (address space only)
    when the model is elastic, else its ``reserve``, admitted in the ledger."""
    plan = elastic.plan_of(worker) or elastic.plan_worker(worker, instance_key(worker.vllm_config, worker.rank),
                                                          worker_gpu(worker))
    if plan is not None:  # memory is admitted chunk by chunk, as the cache grows
        worker.cache_config.kv_cache_memory_bytes = plan.settings.virtual
        return plan.settings.virtual
    return size_kv_cache(worker)


def _rank(worker: Any, doing: str) -> Callable[[], str]:
    """What a worker was doing, for the message of a start-up failure (worked out only then)."""
    return lambda: f"vLLM rank {instance_key(worker.vllm_config, worker.rank).id} on {worker_gpu(worker)}, {doing}"


def _sizing(worker: Any) -> Callable[[], str]:
    """``_rank``'s sizing, naming where the policy sets the reserve a runtime-owned cache is sized to."""

    def what() -> str:
        env, model = AdapterEnv.from_environ(), instance_key(worker.vllm_config, worker.rank).model
        where = None
        try:
            if not elastic.model_is_elastic(env, model):  # as size_worker_cache decides: the reserve sizes it
                where = reserve_where(env.policy, model)
        except AdapterError:
            pass  # a policy that cannot be read now: the message says what it can without it
        return _rank(worker, f"sizing its KV cache to the reserve at {where}" if where else "sizing its KV cache")()

    return what


def sizing_hook(original: Method) -> Method:
    """``Worker.determine_available_memory``: size the cache from the policy, then let vLLM profile."""

    def determine_available_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        with as_startup_failure(_sizing(self)):
            size_worker_cache(self)
        return original(self, *args, **kwargs)

    return determine_available_memory


_size_pending: set[int] = set()
"""``id`` of the cache configs whose KV size the CPU worker's hook set only to pass vLLM's start-up
check: the sizing hook replaces it with the policy's."""


def cpu_worker_init_hook(original: Method) -> Method:
    """``CPUWorker.__init__``: without a KV size, vLLM's CPU worker refuses to start when the
    ``gpu_memory_utilization`` share of host memory is not free — memory it would take for the KV
    cache, which the policy sizes instead. Mark the size as the policy's until the sizing hook sets it."""

    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        cache = vllm_config.cache_config
        if cache.kv_cache_memory_bytes is None:
            cache.kv_cache_memory_bytes = 0  # checked only for being set; replaced before vLLM reads it
            _size_pending.add(id(cache))
        original(self, vllm_config, *args, **kwargs)

    return __init__


def cpu_sizing_hook(original: Method) -> Method:
    """``CPUWorker.determine_available_memory``: the CPU worker's own, which never calls the GPU
    worker's. Size the cache from the policy first, as ``sizing_hook`` does."""

    def determine_available_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        cache = self.cache_config
        if id(cache) in _size_pending:
            _size_pending.discard(id(cache))
            cache.kv_cache_memory_bytes = None
        with as_startup_failure(_sizing(self)):
            size_worker_cache(self)
        return original(self, *args, **kwargs)

    return determine_available_memory


def allocated_hook(original: Method) -> Method:
    """``Worker.initialize_from_config``: an elastic buffer goes on the allocator; a runtime-owned one
    reports its pools (all blocks free) once vLLM allocated it."""

    def initialize_from_config(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        plan = elastic.plan_of(self)
        if plan is not None:  # the buffer goes on the allocator; it reports its pools when made
            with (
                as_startup_failure(_rank(self, "allocating its elastic KV cache")),
                elastic.elastic_allocation(self, plan),
            ):
                return original(self, kv_cache_config, *args, **kwargs)
        result = original(self, kv_cache_config, *args, **kwargs)
        if kv_cache_config.kv_cache_tensors:  # attention-free models have no KV buffer
            setattr(self, LAYOUT_ATTR, PoolLayout.from_kv_cache_config(kv_cache_config))
            with as_startup_failure(_rank(self, "reporting its KV cache")):
                report_worker_pools(self)
        return result

    return initialize_from_config


def manager_hook(original: Method) -> Method:
    """``KVCacheManager.__init__``: the scheduler's block pool becomes elastic over this process's buffer."""

    def __init__(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        original(self, kv_cache_config, *args, **kwargs)
        elastic.bind_manager(self, kv_cache_config)

    return __init__


def start_report_hook(original: Method) -> Method:
    """``EngineCore._initialize_kv_caches``: ask for an elastic layout before vLLM resolves it; then
    start the live reports."""

    def _initialize_kv_caches(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        # Before vLLM resolves the layout: a layout the elastic pool can back, among the backends' own.
        supported = getattr(self.model_executor, "get_supported_kv_cache_layouts", None)  # None: vLLM's default
        is_elastic = elastic.prepare_engine(vllm_config, policy_model(vllm_config), supported)
        result = original(self, vllm_config, *args, **kwargs)
        if is_elastic and result.kv_cache_groups:  # with the mp executor the ranks' buffers are elsewhere
            elastic.offer_ranks(self.model_executor, vllm_config)
        if result.kv_cache_groups:  # attention-free models have nothing to report
            setattr(self, REPORTER_ATTR, EngineReporter.from_environ())
        return result

    return _initialize_kv_caches


def step_report_hook(original: Method) -> Method:
    """``EngineCore.step`` / ``step_with_batch_queue``: the elastic pool's between-steps work, then the
    live report."""

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        elastic.after_step(self)  # before the report: it may change what the pools hold
        reporter = getattr(self, REPORTER_ATTR, None)
        if reporter is not None:
            reporter.maybe_report(self)
        return result

    return step
