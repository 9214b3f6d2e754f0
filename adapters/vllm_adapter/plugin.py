"""The vLLM plugin: sizes the KV cache from the policy and reports its pools to the ledger.

Loaded by vLLM in every process through the ``vllm.general_plugins`` entry point
(``register``). It does nothing unless ``KVPOLICY_ENABLE=1``; once enabled, a vLLM
version other than the validated one, or a missing hook target, fails the start.

Hooks (installed in every process; each runs where its object lives):

- ``Worker.determine_available_memory`` (worker process, one per GPU): admit the
  policy's ``reserve`` in the ledger for this GPU, then set
  ``cache_config.kv_cache_memory_bytes`` to the admitted bytes, vLLM's own switch
  that bypasses memory profiling. vLLM then plans ``reserve // bytes_per_block`` blocks.
- ``Worker.initialize_from_config`` (worker): once vLLM has allocated the KV buffer,
  report this rank's pools (all blocks free): the real buffer replaces the admission.
- ``EngineCore._initialize_kv_caches``, ``EngineCore.step`` / ``step_with_batch_queue``
  (engine core, which owns the scheduler's block pool): at most every
  ``KVPOLICY_REPORT_INTERVAL`` seconds (default 1), and only when they changed, send
  the blocks each group holds to the workers (a non-blocking ``collective_rpc``);
  each worker reports its own pools. Reports come from the process that admitted,
  as the ledger requires.

When the policy marks the model's pools ``owner elastic`` the KV cache runs on the
allocator instead (``elastic_hooks``: virtual capacity, map before handing out, give
back, facts); ``Worker.initialize_from_config`` then hands the model runner (either of
vLLM's two) an allocation context for its KV buffer, and ``KVCacheManager.__init__``
(the scheduler's block pool) is hooked too.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

from kvpolicy.adapters.common import (
    ENV_ENGINE_ID,
    AdapterEnv,
    AdapterError,
    check_version,
    require_attr,
)

from . import elastic_hooks
from .ledger import InstanceKey, VllmLedger
from .plan import VALIDATED_VLLM
from .policy import policy_reserve
from .pools import ALLOCATOR_GRANULE, PoolLayout, held_blocks_per_group, pool_facts

logger = logging.getLogger(__name__)

ENV_REPORT_INTERVAL = "KVPOLICY_REPORT_INTERVAL"
HOOK_MARK = "__kvpolicy_hook__"

_install_lock = threading.Lock()
_installed = False
_ledger: VllmLedger | None = None
_admitted: dict[InstanceKey, int] = {}


# ---------------------------------------------------------------- activation


def register() -> None:
    """Entry point (``vllm.general_plugins``): install the hooks if kvpolicy is enabled."""
    env = AdapterEnv.from_environ()
    if not env.enabled:
        return
    check_version("vLLM", vllm_version(), VALIDATED_VLLM)
    # Children (engine core, workers) inherit the id, so all ranks share one engine id.
    os.environ.setdefault(ENV_ENGINE_ID, _this_engine_id())
    install_hooks()


def vllm_version() -> str:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        raise AdapterError("kvpolicy: the vLLM adapter is enabled but vllm is not installed") from None


def set_ledger(ledger: VllmLedger | None) -> None:
    """Use ``ledger`` for admission and reports in this process (None: back to connect_ledger)."""
    global _ledger
    _ledger = ledger


def connect_ledger(env: AdapterEnv) -> VllmLedger:
    """The ledger this process talks to. The plug point for the shared-memory ledger client."""
    try:
        from kvpolicy.runtime.engines import connect_vllm_ledger
    except ImportError:
        raise AdapterError(
            f"kvpolicy: no ledger client in this install (kvpolicy.runtime.engines), so the KV budget "
            f"cannot be admitted on the GPU ({env.ledger_dir}). Update kvpolicy, or unset KVPOLICY_ENABLE."
        ) from None
    return connect_vllm_ledger(env)


def ledger() -> VllmLedger:
    global _ledger
    if _ledger is None:
        _ledger = connect_ledger(AdapterEnv.from_environ())
    return _ledger


def install_hooks() -> None:
    """Wrap the hook targets once per process; a missing target is an AdapterError."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor
        from vllm.v1.worker.gpu_worker import Worker

        # Elastic KV cache: what elastic_pool/elastic_hooks rely on must exist, or the start fails.
        for name in ("get_new_blocks", "free_blocks", "touch", "get_num_free_blocks", "get_usage",
                     "reset_prefix_cache", "_maybe_evict_cached_block"):
            require_attr(BlockPool, name, "elastic KV cache")
        require_attr(KVCacheCoordinator, "get_num_blocks_to_allocate", "elastic KV cache")
        require_attr(KVCacheManager, "allocate_slots", "elastic KV cache")
        _wrap(KVCacheManager, "__init__", "elastic KV cache", _manager_hook)
        _wrap(Worker, "determine_available_memory", "KV cache sizing", _sizing_hook)
        _wrap(Worker, "initialize_from_config", "pool report at start", _allocated_hook)
        _wrap(EngineCore, "_initialize_kv_caches", "live pool report", _start_report_hook)
        _wrap(EngineCore, "step", "live pool report", _step_report_hook)
        _wrap(EngineCore, "step_with_batch_queue", "live pool report", _step_report_hook)
        require_attr(Executor, "collective_rpc", "live pool report")
        _installed = True


def _wrap(owner: type, name: str, hook: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = require_attr(owner, name, hook)
    if getattr(original, HOOK_MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))  # type: ignore[arg-type]
    setattr(wrapper, HOOK_MARK, True)
    setattr(owner, name, wrapper)


# ---------------------------------------------------------------- identity


def served_model_name(vllm_config: Any) -> str:
    name = getattr(vllm_config.model_config, "served_model_name", None) or vllm_config.model_config.model
    return name[0] if isinstance(name, (list, tuple)) else str(name)


def _this_engine_id() -> str:
    """The default engine id: this host and the process that loaded the plugin first."""
    return f"vllm-{socket.gethostname()}-{os.getpid()}"


def instance_key(vllm_config: Any, rank: int) -> InstanceKey:
    env = AdapterEnv.from_environ()
    engine_id = os.environ.get(ENV_ENGINE_ID) or _this_engine_id()
    dp_rank = getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0
    return InstanceKey(engine_id=engine_id, model=env.model or served_model_name(vllm_config), rank=rank, dp_rank=dp_rank)


def worker_gpu(worker: Any) -> str:
    """The ledger's id of the GPU an initialized vLLM worker uses (see ``gpu_of``)."""
    assigned = getattr(worker.parallel_config, "assigned_physical_gpu_ids", None)
    if assigned is not None and worker.local_rank < len(assigned):
        return f"cuda:{assigned[worker.local_rank]}"
    return gpu_of(worker.local_rank)


def gpu_of(local_rank: int, environ: Mapping[str, str] | None = None) -> str:
    """The ledger's id of logical GPU ``local_rank``: ``cuda:N`` with N the physical index
    (through CUDA_VISIBLE_DEVICES), or the UUID that CUDA_VISIBLE_DEVICES names.

    (vLLM's ``Worker.init_device`` turns ``local_rank`` into the DP-adjusted logical
    index before the KV cache is sized.) Physical indices match NVML's only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    env = os.environ if environ is None else environ
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if local_rank < len(visible):
        device = visible[local_rank]
        return f"cuda:{device}" if device.isdigit() else device
    return f"cuda:{local_rank}"


# ---------------------------------------------------------------- sizing (worker)


def size_kv_cache(worker: Any, reserve_of: Callable[[AdapterEnv, str], int] | None = None) -> int:
    """Admit this model's reserve on the worker's GPU and make vLLM size the KV cache from it.

    Sets ``worker.cache_config.kv_cache_memory_bytes`` to the admitted bytes (rounded down
    to whole 2 MiB allocator granules) and returns them. Refuses (AdapterError) settings
    that would bypass the budget.
    """
    cache = worker.cache_config
    if cache.num_gpu_blocks_override is not None:
        raise AdapterError(
            f"kvpolicy: --num-gpu-blocks-override={cache.num_gpu_blocks_override} would size vLLM's KV "
            "cache past the policy's reserve; remove it while KVPOLICY_ENABLE=1."
        )
    env = AdapterEnv.from_environ()
    key = instance_key(worker.vllm_config, worker.rank)
    if key in _admitted:  # profiling again (e.g. after sleep): the admission stands
        cache.kv_cache_memory_bytes = _admitted[key]
        return _admitted[key]
    plan = getattr(worker, "_kvpolicy_elastic", None)
    if plan is None:
        plan = elastic_hooks.plan_worker(worker, key, worker_gpu(worker))
    if plan is not None:  # elastic: vLLM plans the policy's max; memory is admitted chunk by chunk
        worker._kvpolicy_elastic = plan
        cache.kv_cache_memory_bytes = plan.settings.virtual
        return plan.settings.virtual
    reserve = (reserve_of or (lambda e, m: policy_reserve(e.policy, m)))(env, key.model)
    if cache.kv_cache_memory_bytes is not None and cache.kv_cache_memory_bytes != reserve:
        raise AdapterError(
            f"kvpolicy: --kv-cache-memory-bytes={cache.kv_cache_memory_bytes} disagrees with the policy's "
            f"reserve of {reserve} bytes for {key.model!r}; remove the flag (the policy sizes the cache)."
        )
    admitted = ledger().admit(key, worker_gpu(worker), reserve)
    # Whole allocator granules: the buffer PyTorch rounds up then still fits the admission.
    budget = admitted - admitted % ALLOCATOR_GRANULE
    _admitted[key] = budget
    cache.kv_cache_memory_bytes = budget
    return budget


def _sizing_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def determine_available_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        size_kv_cache(self)
        return original(self, *args, **kwargs)

    return determine_available_memory


# ---------------------------------------------------------------- reports (worker)


def report_worker_pools(worker: Any, held: Sequence[int] | None = None, free: int | None = None) -> None:
    """Report this worker's pools: ``held`` blocks per group and ``free`` blocks of the
    shared pool (default: nothing held, at start)."""
    plan = getattr(worker, "_kvpolicy_elastic", None)
    if plan is not None:
        elastic_hooks.report(plan, held if held is not None else [0] * len(plan.layout.groups))
        return
    layout: PoolLayout | None = getattr(worker, "_kvpolicy_layout", None)
    if layout is None:
        raise AdapterError("kvpolicy: pool report before vLLM allocated this worker's KV cache")
    if held is None:
        held, free = [0] * len(layout.groups), layout.num_blocks - 1
    assert free is not None
    ledger().report_pools(instance_key(worker.vllm_config, worker.rank), pool_facts(layout, held, free))


def report_on_worker(target: Any, held: Sequence[int], free: int) -> None:
    """Run on every worker by the engine core's ``collective_rpc``; ``target`` is vLLM's
    worker wrapper (or the worker). A ledger refusal must not stop serving: it is logged
    with the reason and the last report stands."""
    worker = getattr(target, "worker", target)
    try:
        report_worker_pools(worker, held, free)
    except AdapterError as exc:  # logged, not swallowed: the ledger keeps the previous figures
        logger.error("kvpolicy: pool report of rank %s failed: %s", getattr(worker, "rank", "?"), exc)


def _allocated_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def initialize_from_config(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        plan = getattr(self, "_kvpolicy_elastic", None)
        if plan is not None:  # the buffer goes on the allocator; it reports its pools when made
            with elastic_hooks.elastic_allocation(self, plan):
                return original(self, kv_cache_config, *args, **kwargs)
        result = original(self, kv_cache_config, *args, **kwargs)
        if kv_cache_config.kv_cache_tensors:  # attention-free models have no KV buffer
            self._kvpolicy_layout = PoolLayout.from_kv_cache_config(kv_cache_config)
            report_worker_pools(self)
        return result

    return initialize_from_config


def _manager_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        original(self, kv_cache_config, *args, **kwargs)
        elastic_hooks.bind_manager(self, kv_cache_config)

    return __init__


# ---------------------------------------------------------------- reports (engine core)


class EngineReporter:
    """Sends the block pool's live split to the workers: throttled, and only when it changed."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last_time = float("-inf")
        self._last: tuple[tuple[int, ...], int] | None = None

    @classmethod
    def from_environ(cls) -> EngineReporter:
        text = os.environ.get(ENV_REPORT_INTERVAL, "") or "1"
        try:
            interval = float(text)
        except ValueError:
            raise AdapterError(f"kvpolicy: {ENV_REPORT_INTERVAL}={text!r}: expected seconds, e.g. 1 or 0.5") from None
        return cls(interval)

    def maybe_report(self, engine_core: Any) -> bool:
        """Send the split if the interval passed and it changed; True if sent."""
        now = self._clock()
        if now - self._last_time < self.interval:
            return False
        self._last_time = now
        try:
            coordinator = engine_core.scheduler.kv_cache_manager.coordinator
        except AttributeError as exc:
            raise AdapterError(
                f"kvpolicy: cannot read vLLM's block pool for pool facts ({exc}); this vLLM differs from "
                f"the validated {', '.join(VALIDATED_VLLM)}"
            ) from None
        held, free = held_blocks_per_group(coordinator)
        snapshot = (tuple(held), free)
        if snapshot == self._last:
            return False
        self._last = snapshot
        # Non-blocking: the workers run it between steps; nothing waits for it.
        engine_core.model_executor.collective_rpc(report_on_worker, args=(list(held), free), non_block=True)
        return True


def _start_report_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def _initialize_kv_caches(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        model = AdapterEnv.from_environ().model or served_model_name(vllm_config)
        elastic_hooks.prepare_engine(vllm_config, model)  # before vLLM resolves the KV cache layout
        result = original(self, vllm_config, *args, **kwargs)
        if result.kv_cache_groups:  # attention-free models have nothing to report
            self._kvpolicy_reporter = EngineReporter.from_environ()
        return result

    return _initialize_kv_caches


def _step_report_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        elastic_hooks.after_step(self)  # before the report: it may change what the pools hold
        reporter = getattr(self, "_kvpolicy_reporter", None)
        if reporter is not None:
            reporter.maybe_report(self)
        return result

    return step
