"""The tensor-parallel elastic path's parts in one process: ranks' ``RankMapper`` s called directly.

The ranks here are objects of this process (each its own host driver and ``StaticLimit``),
so the paths that need no real processes run fast: a refusal or a device failure on one
rank undone on the others, a rank answering with another shape or without a buffer, the
group's limit as the smallest of the ranks', and the worker's side of vLLM's
``collective_rpc`` without an elastic plan. The cross-process tests are test_elastic_tp.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from tests.vllm_elastic.elastic_harness import kv_cache_config, make_buffer, make_manager

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.vllm_adapter.elastic.group import group_buffer, ranks_of
from kvpolicy.adapters.vllm_adapter.elastic.layouts import BufferGeometry
from kvpolicy.adapters.vllm_adapter.elastic.lifecycle import rank_call
from kvpolicy.adapters.vllm_adapter.elastic.pool import bind_scheduler
from kvpolicy.adapters.vllm_adapter.elastic.rank import RankMapper
from kvpolicy.adapters.vllm_adapter.elastic.wire import RankAnswer, RankRequest
from kvpolicy.alloc import HostDriver, StaticLimit
from kvpolicy.units import MiB

pytestmark = pytest.mark.vllm

CHUNK = 2 * MiB


@pytest.fixture(scope="module")
def tp_cfg() -> Any:
    return kv_cache_config("qwen3-8b", 16, 256 * MiB, 1024, "BLHNC")


class Local:
    """Ranks in this process: one host driver, ``StaticLimit`` and buffer each."""

    def __init__(self, tp_cfg: Any, limits: list[int]) -> None:
        geometry = BufferGeometry.of(tp_cfg, "BLHNC")
        self.drivers = [HostDriver(capacity=300 * MiB) for _ in limits]
        self.limits = [StaticLimit(n) for n in limits]
        self.buffers = [make_buffer(tp_cfg, d, CHUNK, lim) for d, lim in zip(self.drivers, self.limits, strict=True)]
        self.mappers = [RankMapper(b, rank=r, gpu=f"cuda:{r}", block_stride=geometry.block_stride)
                        for r, b in enumerate(self.buffers)]

    def __call__(self, request: RankRequest) -> list[RankAnswer]:
        return [m.handle(request) for m in self.mappers]

    def mapped(self, rank: int) -> list[int]:
        m = self.buffers[rank].mapping
        return [c for c in range(m.num_chunks) if m.is_mapped(c)]

    def close(self) -> None:
        for b, d in zip(self.buffers, self.drivers, strict=True):
            b.close()
            d.close()


@pytest.fixture
def local(tp_cfg: Any, request: pytest.FixtureRequest) -> Iterator[Local]:
    ranks = Local(tp_cfg, request.param)
    yield ranks
    ranks.close()


def pool_over(ranks: Local, tp_cfg: Any) -> tuple[Any, Any]:
    books = group_buffer(ranks, len(ranks.mappers), refresh_interval=0.0)
    return bind_scheduler(make_manager(tp_cfg, 1024), books, give_back_interval=0.0, report_interval=0.0), books


@pytest.mark.parametrize("local", [[64 * MiB, 16 * MiB, 64 * MiB]], indirect=True)
def test_the_group_limit_is_the_smallest_and_a_rank_s_refusal_is_undone_on_the_others(local: Local, tp_cfg: Any) -> None:
    pool, books = pool_over(local, tp_cfg)
    assert ranks_of(books) is not None and books.limit.read().limit == 16 * MiB + books.pinned
    assert pool.make_room(4)
    assert local.mapped(0) == local.mapped(1) == local.mapped(2) == [0, 1, 2, 3, 4, 5]
    local.limits[1].set(64 * MiB)  # the group may grow now (every rank's limit is 64 MiB) ...
    local.limits[1].mapped += 48 * MiB  # ... but rank 1's admission counts 48 MiB more than it holds
    pool.on_step(active=True)  # the new revision is applied between steps
    assert books.limit.read().limit == 64 * MiB + books.pinned
    assert not pool.make_room(20)
    assert pool.refusals["admission"] == 1 and "rank 1 on cuda:1 refused" in str(pool.last_refusal)
    assert local.mapped(0) == local.mapped(1) == local.mapped(2) == [0, 1, 2, 3, 4, 5]
    assert local.limits[0].mapped == local.limits[2].mapped == 8 * MiB  # chunks 2-5: the pinned two are static
    assert local.limits[0].pending == local.limits[2].pending == 0
    # Every rank reports what the engine waits for (each its facts' elastic.waiting), as the core's books saw
    # it: the core reports after a step, and its next call to the ranks (here the next step's) carries it.
    pool.on_step(active=True)
    pool.on_step(active=True)
    waiting = [lim.waiting for lim in local.limits]
    assert waiting == [pool.last_refusal.needed] * 3 and waiting[0] > 0  # the refused growth, on every rank
    pool.on_step(active=True)  # a step with nothing refused: its report, then the call that carries it
    pool.on_step(active=True)
    assert [lim.waiting for lim in local.limits] == [0, 0, 0]


@pytest.mark.parametrize("local", [[64 * MiB, 64 * MiB]], indirect=True)
def test_a_device_out_of_memory_on_one_rank_is_a_miss_undone_everywhere(local: Local, tp_cfg: Any) -> None:
    pool, _books = pool_over(local, tp_cfg)
    local.drivers[1].inject("cuMemCreate", after=2)
    assert not pool.make_room(8)
    assert pool.refusals["device"] == 1
    assert local.mapped(0) == local.mapped(1) == [0, 1]  # the pinned chunks only
    assert local.limits[0].mapped == local.limits[1].mapped == 0
    pool.on_step(active=True)  # a refusal is retried from the next step on
    assert pool.make_room(8)  # the fault was one call: the next growth maps on both
    assert local.mapped(0) == local.mapped(1) and len(local.mapped(0)) > 2


@pytest.mark.parametrize("local", [[64 * MiB, 64 * MiB]], indirect=True)
def test_ranks_of_different_shapes_or_without_a_buffer_are_refused_at_start(local: Local, tp_cfg: Any) -> None:
    def other_shape(request: RankRequest) -> list[RankAnswer]:
        answers = local(request)
        g = answers[1].geometry
        assert g is not None
        return [answers[0], answers[1].model_copy(update={"geometry": g.model_copy(update={"num_blocks": 7})})]

    with pytest.raises(AdapterError, match="differ in shape"):
        group_buffer(other_shape, 2)

    def one_absent(request: RankRequest) -> list[RankAnswer]:
        return [local(request)[0], RankAnswer.model_validate(rank_call(SimpleNamespace(rank=1), request.model_dump()))]

    with pytest.raises(AdapterError, match=r"rank\(s\) \[1\] of the engine have no elastic KV buffer"):
        group_buffer(one_absent, 2)

    with pytest.raises(AdapterError, match="did not answer"):
        group_buffer(local, 3)  # two answers for three ranks
