"""vLLM 0.33's real KV cache manager and block pool on an elastic buffer, driven for thousands of steps.

A real KVCacheConfig (vLLM's own planning of Qwen3-8B and Gemma-3-1B, block-outermost
layout), vLLM's allocate_kv_cache building its views over the allocator's arena (host
driver), vLLM's KVCacheManager/BlockPool/Request with prefix caching, and — where the
test says so — the real shared-memory ledger. The loop (elastic_harness.Loop) plays
the scheduler. After every step: every block vLLM holds or can hand out lies in a
mapped chunk, the queue holds exactly the free mapped blocks, the allocator's live
set equals vLLM's, the ledger's books equal what the pool holds, and every running
request's KV (and every prefix hit's) reads back as written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from tests.vllm_elastic import pool_loop
from tests.vllm_elastic.elastic_harness import build

from kvpolicy.alloc import BlockPool, BlockSpec, HostDriver, OutOfBlocks, StaticLimit
from kvpolicy.units import GiB, MiB

pytestmark = pytest.mark.vllm

CHUNK = 2 * MiB
GPU = "cuda:0"
CAPACITY = 8 * GiB


def check(loop, buffer) -> None:
    pool_loop.check(loop.pool.vllm, buffer)
    assert buffer.live.is_live(0), "the null block must stay live (pinned)"


def attach_elastic(ledger_dir: Path, name: str, guarantee: int):
    from kvpolicy.runtime.client import attach

    inst = attach(
        id=name, model="qwen3-8b", gpu=GPU, engine="vllm", guarantee=guarantee, elastic=True,
        capacity=CAPACITY, headroom=0, other_used=0, ledger_dir=ledger_dir, handle_signals=False,
    )
    return inst.limit_source()


def publish(ledger_dir: Path, revision: int, budget: int, limits: dict) -> None:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.ledger import GpuLimits

    with LedgerDir(ledger_dir) as ld:
        skipped = ld.publish(ld.read(), revision, {GPU: GpuLimits(CAPACITY, 0, 0, budget)}, limits)
    assert not skipped


def test_thousands_of_steps_on_the_ledger(ledger_dir: Path) -> None:
    """Grow, hit the limit, shrink under a lowered limit (deferred, then applied), grow again, give back."""
    from kvpolicy.runtime.ledger import InstanceLimits

    inst = attach_elastic(ledger_dir, "qwen/0", guarantee=32 * MiB)
    driver = HostDriver(capacity=2 * GiB)
    loop, buffer = build("qwen3-8b", 16, 1 * GiB, driver, CHUNK, inst, seed=1)
    try:
        pinned = buffer.pinned
        assert inst.admit_static(pinned) == pinned  # what the plugin admits for the null block's chunks
        schedule = {
            0: InstanceLimits(limit=128 * MiB, target=96 * MiB, guarantee=32 * MiB),  # below the demand
            1200: InstanceLimits(limit=48 * MiB, target=48 * MiB, guarantee=32 * MiB),  # below what is live
            2200: InstanceLimits(limit=512 * MiB, target=512 * MiB, guarantee=32 * MiB),
        }
        revision = 0
        deferred_seen = applied_after_defer = False
        peak = [0, 0, 0]
        for step in range(3000):
            if step in schedule:
                revision += 1
                publish(ledger_dir, revision, 4 * GiB, {"qwen/0": schedule[step]})
            while len(loop.waiting) < 3:
                loop.submit()
            loop.step()
            check(loop, buffer)
            view = inst.snapshot()
            kv = buffer.mapping
            # The ledger's books are exactly what the pool holds beyond the pinned chunks.
            assert view.mapped == buffer.limit.elastic_held == kv.held_bytes - pinned and view.pending == 0
            assert view.static_admitted == pinned or view.pools["padding"].bytes == pinned
            limit = view.limit
            if view.ack == "deferred":
                deferred_seen = True
            else:
                assert kv.held_bytes - pinned <= limit, f"step {step}: {kv.held_bytes - pinned} held over {limit}"
                applied_after_defer |= deferred_seen and view.ack_revision == 2
            phase = 0 if step < 1200 else 1 if step < 2200 else 2
            peak[phase] = max(peak[phase], kv.held_bytes - pinned)
            if step == 1199:
                assert kv.held_bytes - pinned > 48 * MiB, "the loop should be above the coming limit"
        stats = loop.stats
        assert stats.finished > 100 and stats.prefix_hit_tokens > 0 and stats.verified_tokens > 100_000
        assert stats.misses > 0 and loop.pool.refusals["limit"] > 0  # the limit was reached: misses, no errors
        assert deferred_seen and applied_after_defer, "the lowered limit was deferred, then applied"
        assert 128 * MiB - 3 * CHUNK < peak[0] <= 128 * MiB  # it grew to the limit, never past it
        assert peak[2] > 128 * MiB  # and past it once the limit was raised
        assert view.ack_revision == 3 and view.ack == "applied"
        # Idle: everything finishes; memory above the target goes back (the target is the limit now: stays).
        loop.drain()
        check(loop, buffer)
        publish(ledger_dir, 4, 4 * GiB, {"qwen/0": InstanceLimits(limit=512 * MiB, target=0, guarantee=32 * MiB)})
        loop.pool.on_step(active=False)
        assert buffer.mapping.held_bytes == pinned, "idle with target 0: only the null block's chunks stay"
        assert inst.snapshot().mapped == 0 and inst.snapshot().used == 0
    finally:
        loop.manager = None
        buffer.close()
        assert inst.snapshot().mapped == 0
        inst.detach()
        driver.close()


@pytest.fixture
def host_loop() -> Iterator[Callable[..., tuple[Any, Any, HostDriver]]]:
    """``host_loop(capacity, *build_args, **build_options)``: the synthetic scheduler (``build``) on a
    host driver of ``capacity``, as (loop, buffer, driver); closed after the test."""
    made: list[tuple[Any, HostDriver]] = []

    def make(capacity: int, name: str, block_size: int, budget: int, chunk: int, limit: Any, **options: Any):
        driver = HostDriver(capacity=capacity)
        loop, buffer = build(name, block_size, budget, driver, chunk, limit, **options)
        made.append((buffer, driver))
        return loop, buffer, driver

    yield make
    for buffer, driver in made:
        buffer.close()
        driver.close()


def test_reached_limit_is_an_allocation_miss(host_loop) -> None:
    limit = StaticLimit(24 * MiB)
    loop, buffer, _ = host_loop(1 * GiB, "qwen3-8b", 16, 512 * MiB, CHUNK, limit, seed=2)
    loop.max_running = 16
    for _ in range(400):
        while len(loop.waiting) < 8:
            loop.submit()
        loop.step()
        check(loop, buffer)
        assert buffer.mapping.held_bytes <= 24 * MiB + buffer.pinned
    assert loop.stats.misses > 50 and loop.stats.preemptions > 0 and loop.stats.finished > 5
    assert loop.pool.refusals["limit"] > 0 and set(loop.pool.refusals) <= {"limit"}
    assert limit.pending == 0 and limit.mapped == buffer.mapping.held_bytes - buffer.pinned


@dataclass
class EngineBesideAHog:
    """A vLLM engine (the synthetic scheduler on vLLM's real KV cache manager) and a plain block pool
    of another instance (the hog), both elastic on one GPU's ledger."""

    ours: Any
    other: Any
    loop: Any
    buffer: Any
    hog: BlockPool


@pytest.fixture
def engine_beside_a_hog(host_loop, ledger_dir: Path) -> Iterator[Callable[[int], EngineBesideAHog]]:
    made: list[EngineBesideAHog] = []

    def make(seed: int, **options: Any) -> EngineBesideAHog:
        ours = attach_elastic(ledger_dir, "qwen/0", guarantee=0)
        other = attach_elastic(ledger_dir, "other/0", guarantee=0)
        loop, buffer, driver = host_loop(2 * GiB, "qwen3-8b", 16, 512 * MiB, CHUNK, ours, seed=seed, **options)
        hog = BlockPool(driver, BlockSpec(CHUNK), 64, chunk=CHUNK, limit=other, name="other")
        ours.admit_static(buffer.pinned)
        made.append(EngineBesideAHog(ours, other, loop, buffer, hog))
        return made[-1]

    yield make
    for site in made:  # the pools give their memory back to the ledger before the instances detach
        site.hog.close()
        site.buffer.close()  # again in host_loop: closing twice is a no-op
        site.ours.detach()
        site.other.detach()


def test_budget_taken_by_another_instance_is_a_miss(engine_beside_a_hog, ledger_dir: Path) -> None:
    """The GPU's elastic budget, not the instance's limit, says no: admission refused, a miss."""
    from kvpolicy.runtime.ledger import InstanceLimits

    site = engine_beside_a_hog(seed=3)
    ours, other, loop, buffer, hog = site.ours, site.other, site.loop, site.buffer, site.hog
    publish(ledger_dir, 1, 48 * MiB, {
        "qwen/0": InstanceLimits(limit=64 * MiB, target=64 * MiB, guarantee=0),
        "other/0": InstanceLimits(limit=64 * MiB, target=64 * MiB, guarantee=0),
    })
    taken = hog.alloc(20)  # 40 of the GPU's 48 MiB
    for _ in range(200):
        while len(loop.waiting) < 4:
            loop.submit()
        loop.step()
        check(loop, buffer)
        assert ours.snapshot().mapped + other.snapshot().mapped <= 48 * MiB
    assert loop.pool.refusals["admission"] > 0 and loop.stats.misses > 0
    assert ours.last_refusal is None or ours.last_refusal.reason == "budget"
    assert buffer.mapping.held_bytes - buffer.pinned <= 8 * MiB
    hog.free(taken)
    hog.shrink(0)  # the other instance gives its memory back: ours can grow into it
    before = loop.stats.finished
    for _ in range(100):
        while len(loop.waiting) < 4:
            loop.submit()
        loop.step()
        check(loop, buffer)
    assert buffer.mapping.held_bytes - buffer.pinned > 8 * MiB and loop.stats.finished > before


def test_an_idle_engine_gives_its_cache_to_a_refused_instance(engine_beside_a_hog, ledger_dir: Path) -> None:
    """Under its target an idle engine keeps its prefix cache mapped, until another instance is refused
    memory for the GPU's budget (the ledger's pressure): then its next step gives the free chunks back."""
    from kvpolicy.runtime.ledger import InstanceLimits

    site = engine_beside_a_hog(seed=5)
    ours, other, loop, buffer, hog = site.ours, site.other, site.loop, site.buffer, site.hog
    limits = InstanceLimits(limit=64 * MiB, target=64 * MiB, guarantee=0)
    publish(ledger_dir, 1, 64 * MiB, {"qwen/0": limits, "other/0": limits})
    for _ in range(150):
        while len(loop.waiting) < 4:
            loop.submit()
        loop.step()
    loop.drain()  # idle: every block free, many of them prefix-cached
    check(loop, buffer)
    held = ours.snapshot().mapped
    cached = len(loop.pool.vllm.cached_block_hash_to_block)
    assert held > 16 * MiB and cached > 1
    loop.pool.on_step(active=False)
    assert ours.snapshot().mapped == held  # under its target: kept as a warm cache
    wanted = (64 * MiB - held) // CHUNK + 1
    with pytest.raises(OutOfBlocks):
        hog.alloc(wanted)
    assert other.last_refusal.reason == "budget"
    loop.pool.on_step(active=False)  # it sees the pressure
    check(loop, buffer)
    assert ours.snapshot().mapped <= 4 * CHUNK  # one growth step at most (it uses nothing)
    assert len(loop.pool.vllm.cached_block_hash_to_block) < cached  # those of unmapped chunks were evicted
    taken = hog.alloc(wanted)  # what it was refused, now that the idle engine gave its cache back
    assert ours.snapshot().mapped + other.snapshot().mapped <= 64 * MiB
    hog.free(taken)


def test_a_busy_engine_above_its_target_yields_to_a_refused_instance(engine_beside_a_hog, ledger_dir: Path) -> None:
    """With ``yield_above_target``, vLLM's new requests take the cache only up to its target while
    another instance is refused for the budget: a busy engine far above its target drains to it as
    its requests finish, and the give-backs (every 1 s) hand what they free to the other instance.

    The engine, busy and alone, grows far above its 16 MiB target; then the other asks for a chunk
    every step (0.1 s) until it holds 40 MiB. With the yield it has them 8.3 s later; without it
    (the same run, ``yield_above_target`` 0) 19.3 s later: every block a finished request frees goes
    to the next waiting request, and only what is free at a give-back goes back."""
    from kvpolicy.runtime.ledger import InstanceLimits

    clock = [0.0]
    site = engine_beside_a_hog(seed=7, yield_above_target=2.0, give_back_interval=1.0, clock=lambda: clock[0])
    ours, other, loop, buffer, hog = site.ours, site.other, site.loop, site.buffer, site.hog
    publish(ledger_dir, 1, 64 * MiB, {
        "qwen/0": InstanceLimits(limit=64 * MiB, target=16 * MiB, guarantee=0),
        "other/0": InstanceLimits(limit=64 * MiB, target=48 * MiB, guarantee=0),
    })
    loop.max_running = 32

    def step() -> None:
        while len(loop.waiting) < 8:
            loop.submit()
        loop.step()
        check(loop, buffer)
        clock[0] += 0.1
        assert ours.snapshot().mapped + other.snapshot().mapped <= 64 * MiB

    for _ in range(100):
        step()
    assert ours.snapshot().mapped > 40 * MiB  # nobody else wanted memory
    taken: list[int] = []
    finished = loop.stats.finished
    for _ in range(120):  # 12 s
        if len(taken) * CHUNK < 40 * MiB:
            try:
                taken += hog.alloc(1)
            except OutOfBlocks:
                assert other.last_refusal.reason == "budget"
        step()
    assert len(taken) * CHUNK == 40 * MiB
    assert buffer.mapping.held_bytes - buffer.pinned <= 24 * MiB  # its target, and what no one asks for
    assert loop.stats.finished > finished  # it kept serving meanwhile
    hog.free(taken)


def test_shrinking_releases_only_fully_free_chunks(host_loop) -> None:
    """Under a lowered limit, each chunk is unmapped only once no block in it is held (prefix-cached ones are evicted)."""
    limit = StaticLimit(200 * MiB, 200 * MiB)
    loop, buffer, _ = host_loop(1 * GiB, "qwen3-8b", 16, 1 * GiB, CHUNK, limit, seed=4)
    seen: list[list[int]] = []
    pool = loop.pool
    kv = buffer.mapping
    listener = pool._on_unmap

    def audit(chunks: list[int]) -> None:  # before the pool's own listener: the state vLLM and the allocator see
        for c in chunks:
            for b in buffer.grid.blocks_touching(c):
                assert pool.blocks[b].ref_cnt == 0 and not buffer.live.is_live(b), f"chunk {c} unmapped with block {b} held"
        seen.append(list(chunks))
        listener(chunks)

    buffer.set_listener(audit)
    for _ in range(150):
        while len(loop.waiting) < 4:
            loop.submit()
        loop.step()
    check(loop, buffer)
    held_before = kv.held_bytes
    assert held_before > 100 * MiB
    limit.set(24 * MiB, 24 * MiB)
    for step in range(600):
        if step < 300:
            while len(loop.waiting) < 2:
                loop.submit()
        loop.step()
        check(loop, buffer)
    assert seen, "nothing was released"
    assert limit.acked == (2, "applied") and not kv.deferred
    assert kv.held_bytes <= 24 * MiB + buffer.pinned
    assert pool.refusals["limit"] > 0 or pool.refusals["revision"] > 0


def serve(loop, steps: int, buffer=None) -> None:
    """``steps`` steps with 4 requests waiting at each; with ``buffer``, the invariants after each."""
    for _ in range(steps):
        while len(loop.waiting) < 4:
            loop.submit()
        loop.step()
        if buffer is not None:
            check(loop, buffer)


def warm_cache(host_loop, **options):
    """qwen3-8b under a 256 MiB limit and target after 300 busy steps, drained: a pool well above the
    40 MiB target the give-back tests lower it to, its prefix cache warm. (loop, buffer, limit)"""
    limit = StaticLimit(256 * MiB, 256 * MiB)
    loop, buffer, _ = host_loop(1 * GiB, "qwen3-8b", 16, 1 * GiB, CHUNK, limit, seed=5, **options)
    loop.max_new_tokens = 8
    serve(loop, 300)
    loop.drain()
    check(loop, buffer)
    return loop, buffer, limit


def test_give_back_above_the_target_evicts_prefix_cache_page_aware(host_loop) -> None:
    """Idle above the target: fully free chunks go, highest first; cached blocks in kept chunks still hit, intact."""
    loop, buffer, limit = warm_cache(host_loop)
    kv = buffer.mapping
    cached_before = len(loop.pool.vllm.cached_block_hash_to_block)
    assert cached_before > 0 and kv.held_bytes > 60 * MiB
    limit.set(256 * MiB, 40 * MiB)  # a lower target, same limit
    loop.pool.on_step(active=False)
    check(loop, buffer)
    assert kv.held_bytes <= 40 * MiB + buffer.pinned
    cached_after = len(loop.pool.vllm.cached_block_hash_to_block)
    assert 0 < cached_after < cached_before
    mapped = [c for c in range(kv.num_chunks) if kv.is_mapped(c)]
    assert mapped == list(range(len(mapped))), "the lowest chunks stay, the highest go"
    # New requests over the same prompts still hit what survived, with intact KV (Loop verifies hits).
    hits = loop.stats.prefix_hit_tokens
    serve(loop, 40, buffer)
    assert loop.stats.prefix_hit_tokens > hits


def test_a_bounded_give_back_goes_on_at_the_next_steps_and_a_lowered_limit_goes_whole(host_loop) -> None:
    """``give_back_chunks``: a give-back above the target unmaps at most that many chunks at a step
    (one region here, so a chunk group is one chunk), and the rest at the next steps, though the
    give-back interval has not come round (vLLM's queue and prefix cache consistent at each); a
    lowered limit is applied whole."""
    loop, buffer, limit = warm_cache(host_loop, give_back_interval=1e9, give_back_chunks=3)
    kv = buffer.mapping
    floor = 40 * MiB + buffer.pinned
    assert kv.held_bytes > floor + 6 * CHUNK
    limit.set(256 * MiB, 40 * MiB)  # a lower target, same limit: a new revision, so the first give-back is due
    held = [kv.held_bytes]
    while held[-1] > floor:
        loop.pool.on_step(active=False)
        check(loop, buffer)
        held.append(kv.held_bytes)
        assert len(held) < 100, "the give-back stopped above the target"
    steps = [before - after for before, after in itertools.pairwise(held)]
    assert all(0 < gone <= 3 * CHUNK for gone in steps), steps  # every step gave back, none more than 3 chunks
    assert len(steps) >= 3
    loop.pool.on_step(active=False)
    assert kv.held_bytes == held[-1]  # done: the interval is 1e9 s, so nothing more is due
    serve(loop, 40, buffer)
    loop.drain()
    before = kv.held_bytes
    limit.set(8 * MiB)  # a lowered limit: at once, bound or not
    loop.pool.on_step(active=False)
    check(loop, buffer)
    assert kv.held_bytes <= 8 * MiB + buffer.pinned < before - 3 * CHUNK and not kv.deferred


def test_hybrid_sliding_window_model_with_large_chunks(host_loop) -> None:
    """Gemma-3-1B: full and sliding-window groups share the elastic buffer; 8 MiB chunks."""
    limit = StaticLimit(96 * MiB, 64 * MiB)
    loop, buffer, _ = host_loop(1 * GiB, "gemma-3-1b", 32, 512 * MiB, 8 * MiB, limit, seed=6, max_model_len=1024)
    for step in range(800):
        if step == 400:
            limit.set(32 * MiB, 16 * MiB)
        while len(loop.waiting) < 4:
            loop.submit()
        loop.step()
        check(loop, buffer)
    assert loop.stats.finished > 20 and loop.stats.verified_tokens > 10_000
    assert limit.acked is not None and limit.acked[0] == 2


def test_device_out_of_memory_is_a_miss(host_loop) -> None:
    """The limit allows more than the device has: cuMemCreate fails, the grow is undone, vLLM sees a miss."""
    limit = StaticLimit(512 * MiB)
    loop, buffer, driver = host_loop(48 * MiB, "qwen3-8b", 16, 512 * MiB, CHUNK, limit, seed=7)
    for _ in range(200):
        while len(loop.waiting) < 6:
            loop.submit()
        loop.step()
        check(loop, buffer)
        assert limit.pending == 0 and limit.mapped == buffer.mapping.held_bytes - buffer.pinned
    assert loop.pool.refusals["device"] > 0 and loop.stats.finished > 0
    assert driver.in_use <= 48 * MiB


def test_driver_error_while_growing_is_a_miss_then_growth_resumes(host_loop) -> None:
    limit = StaticLimit(128 * MiB)
    loop, buffer, driver = host_loop(1 * GiB, "qwen3-8b", 16, 512 * MiB, CHUNK, limit, seed=8)
    loop.submit()
    driver.inject("cuMemSetAccess", "CUDA_ERROR_INVALID_VALUE", times=1)
    loop.step()
    check(loop, buffer)
    assert loop.pool.refusals["error"] == 1 and loop.stats.misses >= 1 and not loop.running
    assert buffer.mapping.held_bytes == buffer.pinned and limit.pending == 0 and limit.mapped == 0
    loop.step()  # the next step grows
    check(loop, buffer)
    assert loop.running and buffer.mapping.held_bytes > buffer.pinned
    assert buffer.mapping.arenas[0].calls.zero >= 1  # new chunks are zeroed before their blocks go out


def test_growth_maps_before_handing_out_and_zeroes_new_chunks(host_loop) -> None:
    limit = StaticLimit(64 * MiB)
    loop, buffer, _ = host_loop(1 * GiB, "qwen3-8b", 16, 512 * MiB, CHUNK, limit, seed=9)
    assert loop.pool.vllm.get_num_free_blocks() == 0  # only the null block's chunks are mapped
    req = loop.submit(max_tokens=4)
    loop.step()
    check(loop, buffer)
    ids = loop.manager.get_block_ids(req.request_id)[0]
    kv = buffer.mapping
    assert all(kv.is_mapped(c) for b in ids for c in buffer.grid.chunks_of(b))
    calls = kv.arenas[0].calls
    assert calls.zero >= 1 and calls.map == calls.set_access
    untouched = [b for b in range(1, buffer.num_blocks) if b not in ids and loop.pool._state[b] == 1]
    if untouched:  # a mapped block nobody wrote: zero, as vLLM's torch.zeros buffer would be
        assert not buffer.tensor()[untouched[0] * buffer.bytes_per_block:][: buffer.bytes_per_block].any()


@pytest.mark.parametrize("layout", ["LBHNC", "LBNHC"])
def test_layer_outermost_layouts_map_one_chunk_per_layer_region(host_loop, layout: str) -> None:
    """vLLM's layer-outermost layouts (the CPU backend's LBHNC; LBNHC, vLLM's default): one chunk-aligned
    region per layer in one reservation, block b one page at b × page in each. Grow to a limit, lower it
    below what is live (deferred, then applied), raise it: every token's KV reads back as written."""
    limit = StaticLimit(160 * MiB, 128 * MiB)
    loop, buffer, driver = host_loop(1 * GiB, "qwen3-8b", 16, 512 * MiB, CHUNK, limit, seed=3, layout=layout)
    kv = buffer.mapping
    layers = len(loop.views)
    assert buffer.regions == layers == 36  # one group: a region per layer
    assert kv.contiguous and len(kv.arenas) == buffer.regions and kv.region_bytes % CHUNK == 0
    assert buffer.bytes_per_block == buffer.regions * buffer.grid.block_stride
    # Each layer's view starts on its own region (views of overlaid groups may share one).
    starts = {v.data_ptr() for v in loop.views.values()}
    assert starts <= {buffer.va + r * kv.region_bytes for r in range(buffer.regions)}
    assert len(starts) == buffer.regions <= layers
    loop.max_running = 12
    lowered = False
    for step in range(500):
        if step == 250:
            limit.set(32 * MiB, 32 * MiB)
            lowered = True
        if step == 400:
            limit.set(320 * MiB, 320 * MiB)
        while len(loop.waiting) < 6:
            loop.submit()
        loop.step()
        check(loop, buffer)
        held = kv.held_bytes - buffer.pinned
        assert held % kv.group_bytes == 0  # one chunk in every region, or none
        assert driver.in_use == kv.held_bytes
        if lowered and not kv.deferred:
            assert held <= limit.read().limit
    stats = loop.stats
    assert stats.finished > 20 and stats.verified_tokens > 20_000 and stats.misses > 0
    assert loop.pool.unmapped_chunks > 0 and loop.pool.grown_blocks > 0
