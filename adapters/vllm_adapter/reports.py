"""Live pool reports: the blocks each KV cache group holds, from the engine core to the ledger.

The scheduler's block pool lives in the engine core; the ledger wants each rank's
report from the process that admitted it, the worker. So ``EngineReporter`` (engine
core, after each step) sends the live split to the workers with a non-blocking
``collective_rpc`` — at most every ``KVPOLICY_REPORT_INTERVAL`` seconds, and only
when it changed — and ``report_on_worker`` (each worker) turns it into per-pool facts:
for a runtime-owned cache through ``static_ledger()``, for an elastic one through its
ledger session. The first report, all blocks free, comes from the worker once vLLM
has allocated its buffer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import VllmEnv
from kvpolicy.runtime.errors import LedgerError

from .versions import VALIDATED_VLLM
from .elastic import lifecycle as elastic
from .identity import instance_key
from .ledger import static_ledger
from .pools import PoolLayout, held_blocks_per_group, pool_facts

logger = logging.getLogger(__name__)

LAYOUT_ATTR = "_kvpolicy_layout"
"""The worker attribute that holds its runtime-owned ``PoolLayout`` once vLLM allocated the buffer."""


def report_worker_pools(worker: Any, held: Sequence[int] | None = None, free: int | None = None) -> None:
    """Report this worker's pools: ``held`` blocks per group and ``free`` blocks of the
    shared pool (default: nothing held, at start)."""
    plan = elastic.plan_of(worker)
    if plan is not None:
        if held is None:
            assert plan.layout is not None, "report before the elastic buffer exists"  # as elastic.report says
            held = [0] * len(plan.layout.groups)
        elastic.report(plan, held)
        return
    layout: PoolLayout | None = getattr(worker, LAYOUT_ATTR, None)
    if layout is None:
        raise AdapterError("kvpolicy: pool report before vLLM allocated this worker's KV cache")
    if held is None:
        held, free = [0] * len(layout.groups), layout.num_blocks - 1
    assert free is not None
    static_ledger().report_pools(instance_key(worker.vllm_config, worker.rank), pool_facts(layout, held, free))


def report_on_worker(target: Any, held: Sequence[int], free: int) -> None:
    """Run on every worker by the engine core's ``collective_rpc``; ``target`` is vLLM's
    worker wrapper (or the worker). A ledger refusal must not stop serving: it is logged
    with the reason and the last report stands."""
    worker = getattr(target, "worker", target)
    try:
        report_worker_pools(worker, held, free)
    except (AdapterError, LedgerError) as exc:  # logged, not swallowed: the ledger keeps the previous figures
        logger.error("kvpolicy: pool report of rank %s failed: %s", getattr(worker, "rank", "?"), exc)


class EngineReporter:
    """Sends the block pool's live split to the workers: throttled, and only when it changed."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last_time = float("-inf")
        self._last: tuple[tuple[int, ...], int] | None = None

    @classmethod
    def from_environ(cls) -> EngineReporter:
        return cls(VllmEnv.from_environ().report_interval)

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
