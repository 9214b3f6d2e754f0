"""The elastic SWA pool with the real SGLang 0.5.23 classes on CPU, over the host driver.

The real ``DeepSeekV4TokenToKVPool`` is built by SGLang's own ``_build_dsv4_kv_pool``
with its SWA tensors over an ``ElasticSWA``; the real ``SWATokenToKVPoolAllocator``
hands out its pages; a synthetic scheduler admits requests (``alloc_extend``), decodes
past the sliding window (``alloc_decode``, ``free_swa`` of the pages that left it),
finishes them, keeps some as a radix-cache prefix and reuses them, and moves the limit.
After every step: every page SGLang can hand out or holds is mapped, the data written
through the views survives, the bytes held stay within the limit, and an allocation
fails only as SGLang fails a full pool.

Budget: one fixed, seeded run of ``LONG_STEPS`` (2,000) scheduler steps, and
``KVPOLICY_SWA_STEPS`` ops per hypothesis example (default 40) times the examples
(``KVPOLICY_SWA_EXAMPLES``, default 8) for variety; longer runs: ``KVPOLICY_SWA_STEPS=400
KVPOLICY_SWA_EXAMPLES=25``.
"""

from __future__ import annotations

import itertools
import os
from contextlib import ExitStack
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4 import elastic as E
from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry
from kvpolicy.alloc import HostDriver, StaticLimit
from kvpolicy.units import GiB, MiB
from tests.sglang.sglang_support import (
    TINY_RATIOS,
    build_pools_through_sglang,
    kv_cache_configurator,
    published_server_args,
    single_process_parallel,
)

pytestmark = pytest.mark.sglang

TINY = ModelGeometry(num_hidden_layers=7, compress_ratios=TINY_RATIOS, max_position_embeddings=65536)
CHUNK = 2 * MiB
GROUP = TINY.num_hidden_layers * CHUNK  # one chunk in every SWA layer
P = 256
WINDOW = TINY.sliding_window
STEPS = int(os.environ.get("KVPOLICY_SWA_STEPS", "40"))
EXAMPLES = int(os.environ.get("KVPOLICY_SWA_EXAMPLES", "8"))


@dataclass
class Built:
    pool: object
    sizes: object
    swa: E.ElasticSWA
    limit: StaticLimit
    driver: HostDriver
    stock: object = None


def build(sglang_env, limit_bytes: int, *, budget: int = 96 * MiB, elastic: bool = True, device: str = "cpu",
          driver=None, **swa_options) -> Built:
    """The real V4 pool for ``budget`` (SWA at half the full tokens: 30 pages for 96 MiB, about 13 pages
    per chunk group), its SWA tensors on an ``ElasticSWA`` under a ``StaticLimit`` unless not ``elastic``."""
    with ExitStack() as stack:
        stack.enter_context(single_process_parallel())
        args = stack.enter_context(published_server_args(max_running_requests=16, swa_full_tokens_ratio=0.5,
                                                         device=device))
        kvc = kv_cache_configurator(TINY, args)
        kvc.device = device
        original = type(kvc)._profile_available_bytes
        type(kvc)._profile_available_bytes = lambda self, pre: budget
        try:
            if not elastic:
                built = build_pools_through_sglang(kvc)
                return Built(built.pool, built.sizes, None, None, None)  # type: ignore[arg-type]
            driver = driver if driver is not None else HostDriver(capacity=1 * GiB)
            limit = StaticLimit(limit_bytes)
            make = lambda layers, pages, page_bytes: E.ElasticSWA(  # noqa: E731 - the factory swa_backed_by calls
                driver, layers=layers, pages=pages, page_bytes=page_bytes, chunk=CHUNK, limit=limit, **swa_options)
            with E.swa_backed_by(make) as made:
                built = build_pools_through_sglang(kvc)
        finally:
            type(kvc)._profile_available_bytes = original
    (swa,) = made
    return Built(built.pool, built.sizes, swa, limit, driver)


def allocator_over(b: Built, device: str = "cpu"):
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    outer = SWATokenToKVPoolAllocator(b.sizes.full_max_total_num_tokens, b.sizes.swa_max_total_num_tokens, P,
                                      torch.int64, device, b.pool, need_sort=True)
    b.swa.bind(outer)
    return outer


@pytest.fixture(scope="module")
def stock(sglang_env):
    return build(sglang_env, 0, elastic=False)


def test_the_swa_tensors_are_views_and_the_other_pools_are_sglangs_own(sglang_env, stock):
    import torch

    b = build(sglang_env, 8 * GROUP)
    swa = b.pool.swa_kv_pool.kv_buffer
    stock_swa = stock.pool.swa_kv_pool.kv_buffer
    assert [t.shape for t in swa] == [t.shape for t in stock_swa] and swa[0].dtype == torch.uint8
    assert swa[0].data_ptr() == b.swa.mapping.arenas[0].va  # a view: no copy, no torch allocation
    # Idle: only the chunks of the padding page are mapped: one chunk group, zeroed as torch.zeros would.
    assert b.swa.held_bytes == b.swa.pinned == GROUP and b.driver.in_use == GROUP
    assert not swa[0][:2].any()
    # The compressed, indexer and state pools are byte-identical to a build without kvpolicy.
    for ratio in (4, 128):
        for a, s in zip(b.pool.kv_pools[ratio].kv_buffer, stock.pool.kv_pools[ratio].kv_buffer, strict=True):
            assert a.shape == s.shape and a.dtype == s.dtype and torch.equal(a, s)
    for a, s in zip(b.pool.index_pools[4].index_k_with_scale_buffer,
                    stock.pool.index_pools[4].index_k_with_scale_buffer, strict=True):
        assert a.shape == s.shape and torch.equal(a, s)
    states = lambda pool: [p.kv_score_buffer.kv_score for p in [*pool.compress_state_pools,  # noqa: E731 - a one-line helper of this test
                                                                 *pool.indexer_compress_state_pools] if p is not None]
    # The compressor state is torch.empty in SGLang (rows are written before they are read): the same
    # tensors, whose contents are whatever the memory held.
    for a, s in zip(states(b.pool), states(stock.pool), strict=True):
        assert (a.shape, a.stride(), a.dtype, a.device) == (s.shape, s.stride(), s.dtype, s.device)


@dataclass
class Request:
    full: list[int] = field(default_factory=list)
    """Full-pool token indices, in order."""
    swa_freed_to: int = 0
    """Tokens below this position have had their SWA pages freed (out of the window)."""
    tag: int = 0


class Scheduler:
    """Drives the real allocator as SGLang's scheduler would, and checks the invariants after each step."""

    def __init__(self, b: Built, outer, device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.device = device
        self.b, self.outer = b, outer
        self.running: list[Request] = []
        self.cached: list[Request] = []
        self.tags = 0
        self.refused = 0
        self.steps = 0

    # -- helpers --------------------------------------------------------------------------------
    def t(self, *values: int):
        """A CPU tensor (SGLang's ``*_cpu`` arguments)."""
        return self.torch.tensor(values, dtype=self.torch.int64)

    def d(self, *values: int):
        """The same on the pool's device."""
        return self.torch.tensor(values, dtype=self.torch.int64, device=self.device)

    def swa_loc(self, full: list[int]):
        return self.outer.translate_loc_from_full_to_swa(self.d(*full)).cpu()

    def resident_swa_pages(self, r: Request) -> set[int]:
        start = r.swa_freed_to
        return {int(x) // P for x in self.swa_loc(r.full[start:]).tolist()} if len(r.full) > start else set()

    def write(self, r: Request) -> None:
        """Write the request's tag into each layer at each of its SWA-resident tokens' pages."""
        for page in self.resident_swa_pages(r):
            for layer in self.b.pool.swa_kv_pool.kv_buffer:
                layer[page, :8] = r.tag

    # -- scheduler steps ------------------------------------------------------------------------------
    def admit(self, length: int) -> None:
        self.tags += 1
        r = Request(tag=self.tags % 250 + 1)
        prefix = 0
        last = -1
        if self.cached:  # a radix-cache hit: the newest cached request's tokens are the prefix
            hit = self.cached.pop()
            r.full, r.swa_freed_to, prefix, last = hit.full, hit.swa_freed_to, len(hit.full), hit.full[-1]
            r.tag = hit.tag
        seq = prefix + length
        out = self.outer.alloc_extend(self.d(prefix), self.t(prefix), self.d(seq), self.t(seq), self.d(last), length)
        if out is None:
            self.refused += 1
            if prefix:
                self.cached.append(r)
            return
        r.full = r.full + out.cpu().tolist()
        self.running.append(r)
        self.write(r)

    def decode(self) -> None:
        if not self.running:
            return
        seq = [len(r.full) + 1 for r in self.running]
        last = [r.full[-1] for r in self.running]
        out = self.outer.alloc_decode(self.d(*seq), self.t(*seq), self.d(*last))
        if out is None:
            self.refused += 1
            self.retract()
            return
        for r, loc in zip(self.running, out.cpu().tolist(), strict=True):
            r.full.append(loc)
            self.trim_window(r)
            self.write(r)

    def trim_window(self, r: Request) -> None:
        """Free the SWA pages wholly below the sliding window, as SGLang's scheduler does."""
        keep_from = max(0, len(r.full) - WINDOW - P)  # position of the first token the window may still read
        upto = keep_from // P * P
        if upto > r.swa_freed_to:
            self.outer.free_swa(self.d(*r.full[r.swa_freed_to:upto]))
            r.swa_freed_to = upto

    def retract(self) -> None:
        """Out of memory in decode: SGLang retracts the newest request (frees it entirely)."""
        r = self.running.pop()
        self.free(r)

    def free(self, r: Request) -> None:
        if len(r.full) > r.swa_freed_to:
            self.outer.free_swa(self.d(*r.full[r.swa_freed_to:]))
        self.outer.free_full(self.d(*r.full))

    def finish(self, index: int, cache: bool) -> None:
        if not self.running:
            return
        r = self.running.pop(index % len(self.running))
        if cache and len(r.full) % P == 0 and len(self.cached) < 2:
            self.cached.append(r)  # kept whole, page-aligned: a later request extends it
        else:
            self.free(r)

    def set_limit(self, groups: int, at_once: bool = True) -> None:
        """A new limit revision, synced at once or left to the pool's next allocation or tick."""
        self.b.limit.set(groups * GROUP)
        if at_once:
            self.b.swa.sync()

    # -- invariants ---------------------------------------------------------------------------------
    def check(self, read_ids: bool = True) -> None:
        """Every invariant; with ``read_ids`` the pool then reads the page ids still on the device (``settle``)
        and its live pages must be those SGLang holds. A check that leaves them unread lets the next steps run
        with the pool's books behind SGLang's, as between two give-backs in an engine."""
        swa, outer = self.b.swa, self.outer
        inner = outer.swa_attn_allocator
        free = set(inner.get_all_free_pages().cpu().tolist())
        assert all(swa.visible[p] and swa.page_is_mapped(p) for p in free), "a free page SGLang can hand out is unmapped"
        resident = [self.resident_swa_pages(r) for r in [*self.running, *self.cached]]
        for r, pages in zip([*self.running, *self.cached], resident, strict=True):
            assert all(swa.page_is_mapped(p) for p in pages), "a page SGLang holds is unmapped"
            assert not pages & free
            for p in pages:
                for layer in self.b.pool.swa_kv_pool.kv_buffer:
                    assert int(layer[p, 0]) == r.tag, "data written through the views did not survive"
        reading = swa.mapping.limit.read()
        if reading.revision == swa.mapping.revision and not swa.mapping.deferred:
            assert swa.held_bytes <= reading.limit
        assert swa.unread_calls < E.UNREAD_AT_MOST, "the ids waiting on the device are bounded"
        used = swa.used_bytes  # exact before the ids still on the device are read
        held = sum(len(pages) for pages in resident)
        assert used == held * swa.page_bytes * swa.layers
        if read_ids:
            swa.settle()
            assert all(swa.live.is_live(p) for pages in resident for p in pages)
            assert used == swa.used_bytes == (swa.live.count - 1) * swa.page_bytes * swa.layers


OPS = st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 3 * P)),
    st.tuples(st.just("decode"), st.integers(1, 2 * P)),
    st.tuples(st.just("finish"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("limit"), st.integers(0, 3), st.booleans()),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=STEPS), first_limit=st.integers(0, 3), read_every=st.integers(1, 12))
def test_a_synthetic_scheduler_never_touches_an_unmapped_page(sglang_env, ops, first_limit, read_every):
    b = build(sglang_env, (1 + first_limit) * GROUP)
    run_scheduler(b, allocator_over(b), ops, read_every=read_every)
    b.swa.close()
    assert b.driver.in_use == 0


def run_scheduler(b: Built, outer, ops, device: str = "cpu", read_every: int = 5) -> Scheduler:
    """Play ``ops`` on the real allocator, checking every invariant after each step (and the pool's live pages
    every ``read_every`` checks); frees everything at the end."""
    s = Scheduler(b, outer, device)
    checks = 0

    def check() -> None:
        nonlocal checks
        checks += 1
        s.check(read_ids=checks % read_every == 0)

    check()
    for op in ops:
        if op[0] == "admit":
            s.admit(op[1])
        elif op[0] == "decode":
            for _ in range(op[1]):
                s.decode()
                check()
        elif op[0] == "finish":
            s.finish(op[1], op[2])
        else:
            s.set_limit(1 + op[1], at_once=len(op) < 3 or op[2])
        check()
    for r in [*s.running, *s.cached]:
        s.free(r)
    s.running.clear()
    s.cached.clear()
    b.swa.sync()
    s.check()
    assert b.swa.live.count == 1  # only the padding page
    return s


LONG_STEPS = 2000


def seeded_ops(seed: int, steps: int, limit_every: int = 250) -> list[tuple]:
    """A scheduler's steps from ``seed``: mostly one-token decodes, admissions (radix-cache reuse among them)
    and finishes, and the limit moved every ``limit_every`` steps."""
    import random

    rng = random.Random(seed)
    ops: list[tuple] = []
    for step in range(steps):
        if step % limit_every == limit_every - 1:
            ops.append(("limit", rng.randrange(4), rng.random() < 0.5))
            continue
        kind = rng.choices(("admit", "decode", "finish"), weights=(2, 6, 2))[0]
        if kind == "admit":
            ops.append(("admit", rng.randint(1, 3 * P)))
        elif kind == "decode":
            ops.append(("decode", 1))
        else:
            ops.append(("finish", rng.randrange(8), rng.random() < 0.5))
    return ops


def test_two_thousand_scheduler_steps_keep_every_page_mapped_and_every_byte_written(sglang_env):
    """A fixed, seeded run of ``LONG_STEPS`` scheduler steps (admissions with radix-cache reuse, decode past
    the window, finishes, and the limit moved every 250 steps), every invariant checked after each step."""
    b = build(sglang_env, 3 * GROUP)
    s = run_scheduler(b, allocator_over(b), seeded_ops(20, LONG_STEPS))
    assert s.refused > 0 and b.swa.mapping.groups_unmapped > 0  # the limit was reached, and memory went back
    b.swa.close()
    assert b.driver.in_use == 0


def test_a_reached_limit_is_an_sglang_allocation_failure_and_frees_make_room(sglang_env):
    b = build(sglang_env, 2 * GROUP)  # the pinned group and one more
    outer = allocator_over(b)
    s = Scheduler(b, outer)
    per_group = len([p for p in range(1, b.swa.pages) if b.swa.visible[p]])
    assert outer.swa_available_size() > per_group * P  # what the limit still lets it map counts as available
    while True:
        before = s.refused
        s.admit(P)
        s.check()
        if s.refused > before:
            break
    assert b.swa.held_bytes == 2 * GROUP and b.swa.refusals >= 1  # refused at the limit, not past it
    assert outer.swa_available_size() < P  # the scheduler now sees a full SWA pool
    b.swa.report()  # its report says what waits for memory (the facts' elastic.waiting): a chunk group
    assert b.limit.waiting == GROUP
    s.finish(0, cache=False)
    s.admit(P)
    s.check()
    assert s.running and s.refused == 1  # the freed pages served the next request
    b.swa.report()  # nothing was refused since the last report
    assert b.limit.waiting == 0


def test_a_lower_limit_unmaps_only_fully_free_chunks_and_waits_for_the_rest(sglang_env):
    b = build(sglang_env, 9 * GROUP, budget=400 * MiB)  # 148 SWA pages: 11 chunk groups
    outer = allocator_over(b)
    s = Scheduler(b, outer)
    for _ in range(48):
        s.admit(P)
    s.check()
    held = b.swa.held_bytes
    assert held > 3 * GROUP
    for i in range(0, len(s.running), 2):  # free every other request: chunks half used stay mapped
        s.free(s.running[i])
    s.running = s.running[1::2]
    s.set_limit(2)
    s.check()
    assert b.swa.mapping.deferred and b.swa.held_bytes > 2 * GROUP  # live pages pin their chunks
    while s.running:
        s.finish(0, cache=False)
        s.check(read_ids=False)  # while a limit is deferred the pool reads each free as it comes
    assert not b.swa.mapping.deferred and b.swa.held_bytes <= 2 * GROUP


def test_a_bounded_give_back_goes_on_at_the_next_ticks_and_a_lowered_limit_goes_whole(sglang_env):
    """``give_back_chunks``: above the target one tick unmaps at most that many chunks, in whole groups
    of one chunk per layer (17 chunks over 7 layers: 2 groups), the next ticks the rest, though the
    give-back interval has not come round; SGLang's free list and the pages it holds stay mapped
    throughout. A lowered limit goes at once."""
    chunks = 2 * TINY.num_hidden_layers + 3
    b = build(sglang_env, 11 * GROUP, budget=400 * MiB, give_back_chunks=chunks, give_back_interval=1e9)
    outer = allocator_over(b)
    s = Scheduler(b, outer)
    for _ in range(48):
        s.admit(2 * P)
    while len(s.running) > 2:
        s.finish(len(s.running) - 1, cache=False)
    s.check()
    floor = 2 * GROUP  # the pinned group and the two running requests' pages
    assert b.swa.held_bytes > floor + 4 * GROUP
    b.limit.set(11 * GROUP, target=floor)  # a new revision: the first give-back is due at once
    held = [b.swa.held_bytes]
    while held[-1] > floor and len(held) < 50:
        b.swa.tick()
        s.check()
        held.append(b.swa.held_bytes)
    steps = [before - after for before, after in itertools.pairwise(held)]
    assert held[-1] <= floor and len(steps) >= 3, held
    assert all(0 < gone <= 2 * GROUP for gone in steps), steps
    b.swa.tick()
    assert b.swa.held_bytes == held[-1]  # nothing more is due: the interval is 1e9 s
    b.limit.set(11 * GROUP)  # room again: the pool grows back, then every request finishes
    for _ in range(40):
        s.admit(2 * P)
    while s.running:
        s.finish(0, cache=False)
    s.check()
    before = b.swa.held_bytes
    b.limit.set(1 * GROUP)  # a lowered limit: at once, bound or not
    b.swa.tick()
    s.check()
    assert b.swa.held_bytes <= 1 * GROUP < before - 2 * GROUP and not b.swa.mapping.deferred


def test_a_limit_that_arrives_between_the_capacity_check_and_the_allocation_unmaps_no_held_page(sglang_env):
    """The page ids SGLang handed out are still on the device when a lower limit revision reaches the pool
    inside an allocation (the controller publishes at any moment): the pool reads them before it applies
    the revision, so it unmaps only chunks that are truly free."""
    b = build(sglang_env, 9 * GROUP, budget=400 * MiB)
    outer = allocator_over(b)
    s = Scheduler(b, outer)
    while b.swa.held_bytes < 4 * GROUP:
        s.admit(P)
    s.check(read_ids=False)
    assert b.swa.unread_calls, "the hand-outs wait on the device"
    held = b.swa.held_bytes
    b.limit.set(held - GROUP)  # no sync, no tick: the next allocation that must grow applies it
    while s.refused == 0:
        s.admit(P)
        s.check(read_ids=False)
    assert b.swa.mapping.revision == b.limit.read().revision and b.swa.mapping.deferred
    s.check()
