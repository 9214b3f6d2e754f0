"""An elastic SWA pool at SGLang's start-up: what the hooks build, from the planned pool to the bound allocator.

In the order the hooks call it, in the scheduler process of the one TP rank:

1. the budget hook plans the pools with the elastic SWA pool (``plan.budget_for_reserve``)
   and opens the engine's ledger session as an elastic instance owed the pool's
   guarantee, then admits the ``reserve`` statically (the other pools, the request
   table and the SWA pool's pinned chunks);
2. the pool hook builds SGLang's ``DeepSeekV4TokenToKVPool`` inside ``elastic.swa_backed_by``
   with ``maker``: the SWA tensors are views over one reservation per layer, mapped
   under ``PinnedFirst(session limit, pinned chunks, cap = the policy's max)``;
   ``check_built`` holds SGLang's pool to the plan;
3. the allocator hook binds the ``SWATokenToKVPoolAllocator`` SGLang builds over that
   pool (``bind_allocator``): pages are mapped before they are handed out, a growth the
   limit refuses is an ordinary SGLang allocation failure, and the pool ticks (gives
   back, reports) from the allocator entry points the scheduler calls every round.

Imports torch and sglang only when a pool is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpolicy.alloc import HostDriver, open_driver
from kvpolicy.alloc.pinned import PinnedFirst
from kvpolicy.units import format_bytes

from ..errors import AdapterError
from .elastic import ElasticSWA
from .plan import ElasticPool
from .ports import ElasticLedgerSession

GIVE_BACK_INTERVAL = 1.0
"""Seconds between give-backs of SWA memory above the target (a new limit is applied at once)."""
REPORT_INTERVAL = 1.0
"""Seconds between reports of the SWA pool's use to the ledger."""


def driver_for(device: str, gpu_index: int, planned: ElasticPool) -> Any:
    """The CUDA driver on a CUDA device; elsewhere (tests, CPU) host memory as large as the reservation."""
    if str(device).partition(":")[0] == "cuda":
        return open_driver("cuda", device=gpu_index)
    return HostDriver(capacity=planned.virtual + planned.chunk)


def maker(
    session: ElasticLedgerSession, planned: ElasticPool, driver: Any, name: str, *, give_back_chunks: int | None = None
) -> Callable[[int, int, int], ElasticSWA]:
    """What ``elastic.swa_backed_by`` calls for SGLang's SWA pool: the ``ElasticSWA`` of the plan, or an
    ``AdapterError`` if SGLang asks for another shape (before anything is mapped). ``give_back_chunks``:
    ``KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS``, the bound of one give-back (None: no bound)."""

    def make(layers: int, pages: int, page_bytes: int) -> ElasticSWA:
        if (layers, pages, page_bytes) != (planned.layers, planned.pages, planned.page_bytes):
            raise AdapterError(
                f"kvpolicy: SGLang builds its SWA pool as {layers} layers x {pages} pages of {page_bytes} B; the "
                f"elastic plan has {planned.layers} x {planned.pages} of {planned.page_bytes} B. This SGLang differs "
                "from the validated one; mark the SWA pool `owner runtime`."
            )
        limit = PinnedFirst(session.limit_source(), planned.pinned, cap=planned.limit)
        swa = ElasticSWA(
            driver, layers=layers, pages=pages, page_bytes=page_bytes, chunk=planned.chunk, limit=limit,
            name=name, give_back_interval=GIVE_BACK_INTERVAL, report_interval=REPORT_INTERVAL,
            give_back_chunks=give_back_chunks,
        )
        swa.on_activity = session.touch
        return swa

    return make


def check_built(made: list[ElasticSWA], planned: ElasticPool) -> ElasticSWA:
    """The one elastic SWA pool SGLang's pool constructor made, held to the plan."""
    if len(made) != 1:
        for swa in made:
            swa.close()
        raise AdapterError(
            f"kvpolicy: SGLang built {len(made)} SWA pools for one DeepSeek-V4 pool (expected 1); this code path "
            "is not supported with an elastic SWA pool"
        )
    swa = made[0]
    if swa.pinned != planned.pinned:
        swa.close()
        raise AdapterError(
            f"kvpolicy: the elastic SWA pool pinned {format_bytes(swa.pinned)} for the padding page, the plan "
            f"{format_bytes(planned.pinned)}"
        )
    return swa


def bind_allocator(allocator: Any, swa: ElasticSWA) -> None:
    """Bind the allocator SGLang built over the elastic pool; anything but the paged SWA allocator is refused."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    if type(allocator) is not SWATokenToKVPoolAllocator or allocator.swa_req_ring:
        raise AdapterError(
            f"kvpolicy: SGLang built a {type(allocator).__name__} over the elastic SWA pool; only its paged "
            "SWATokenToKVPoolAllocator (no per-request SWA ring, no HiSparse) hands out pages the elastic pool "
            "can map first. Mark the SWA pool `owner runtime`."
        )
    swa.bind(allocator)
