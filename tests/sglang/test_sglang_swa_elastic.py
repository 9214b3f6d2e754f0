"""The elastic SWA pool with the real SGLang 0.5.23 classes on CPU, over the host driver.

The real ``DeepSeekV4TokenToKVPool`` is built by SGLang's own ``_build_dsv4_kv_pool``
with its SWA tensors over an ``ElasticSWA``; the real ``SWATokenToKVPoolAllocator``
hands out its pages; a synthetic scheduler admits requests (``alloc_extend``), decodes
past the sliding window (``alloc_decode``, ``free_swa`` of the pages that left it),
finishes them, keeps some as a radix-cache prefix and reuses them, and moves the limit.
After every step: every page SGLang can hand out or holds is mapped, the data written
through the views survives, the bytes held stay within the limit, and an allocation
fails only as SGLang fails a full pool.

Budget: ``KVPOLICY_SWA_STEPS`` scheduler steps per example (default 40) times the
hypothesis examples (``KVPOLICY_SWA_EXAMPLES``, default 8): a few hundred steps (decode steps more) in
CI on a 2-core machine; the issue's "thousands of steps" is ``KVPOLICY_SWA_STEPS=400 KVPOLICY_SWA_EXAMPLES=25``.
"""

from __future__ import annotations

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
          driver=None) -> Built:
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
                driver, layers=layers, pages=pages, page_bytes=page_bytes, chunk=CHUNK, limit=limit)
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
    b.swa.attach(outer.swa_attn_allocator)
    E.wrap_swa_allocator(outer, b.swa)
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

    def set_limit(self, groups: int) -> None:
        self.b.limit.set(groups * GROUP)
        self.b.swa.sync()

    # -- invariants ---------------------------------------------------------------------------------
    def check(self) -> None:
        swa, outer = self.b.swa, self.outer
        inner = outer.swa_attn_allocator
        free = set(inner.get_all_free_pages().cpu().tolist())
        assert all(swa.visible[p] and swa.page_is_mapped(p) for p in free), "a free page SGLang can hand out is unmapped"
        for r in [*self.running, *self.cached]:
            pages = self.resident_swa_pages(r)
            assert all(swa.page_is_mapped(p) for p in pages), "a page SGLang holds is unmapped"
            assert all(swa.live.is_live(p) for p in pages) and not pages & free
            for p in pages:
                for layer in self.b.pool.swa_kv_pool.kv_buffer:
                    assert int(layer[p, 0]) == r.tag, "data written through the views did not survive"
        if not swa.mapping.deferred:
            assert swa.held_bytes <= self.b.limit.read().limit
        assert swa.used_bytes == (swa.live.count - 1) * swa.page_bytes * swa.layers


OPS = st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 3 * P)),
    st.tuples(st.just("decode"), st.integers(1, 2 * P)),
    st.tuples(st.just("finish"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("limit"), st.integers(0, 3)),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=STEPS), first_limit=st.integers(0, 3))
def test_a_synthetic_scheduler_never_touches_an_unmapped_page(sglang_env, ops, first_limit):
    b = build(sglang_env, (1 + first_limit) * GROUP)
    run_scheduler(b, allocator_over(b), ops)
    b.swa.close()
    assert b.driver.in_use == 0


def run_scheduler(b: Built, outer, ops, device: str = "cpu") -> Scheduler:
    """Play ``ops`` on the real allocator, checking every invariant after each step; frees everything at the end."""
    s = Scheduler(b, outer, device)
    s.check()
    for op in ops:
        if op[0] == "admit":
            s.admit(op[1])
        elif op[0] == "decode":
            for _ in range(op[1]):
                s.decode()
                s.check()
        elif op[0] == "finish":
            s.finish(op[1], op[2])
        else:
            s.set_limit(1 + op[1])
        s.check()
    for r in [*s.running, *s.cached]:
        s.free(r)
    s.running.clear()
    s.cached.clear()
    b.swa.sync()
    s.check()
    assert b.swa.live.count == 1  # only the padding page
    return s


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
    s.finish(0, cache=False)
    s.admit(P)
    s.check()
    assert s.running and s.refused == 1  # the freed pages served the next request


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
        s.check()
    assert not b.swa.mapping.deferred and b.swa.held_bytes <= 2 * GROUP


# ------------------------------------------------------------------ start-up


@pytest.fixture
def elastic_policy_hooks(tmp_path):
    """The real hooks, reading a real policy that marks the SWA pool elastic."""
    from kvpolicy.adapters.settings import AdapterEnv
    from kvpolicy.adapters.sglang_dsv4 import hooks
    from kvpolicy.adapters.sglang_dsv4.ports import policy_reserve
    from tests.support.ledgers import InProcessLedger

    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\nmodel "tiny" {\n  engine sglang\n  reserve 48 MiB\n  max 1 GiB\n'
                      '  pool swa { owner elastic }\n}\n')
    env = AdapterEnv(enabled=True, policy=policy, model="tiny", ledger_dir=tmp_path)
    ledger = InProcessLedger({"cuda:0": 80 * GiB})
    state = hooks.AdapterState(reserve_source=policy_reserve(env), connect=ledger.session, model_name="tiny")
    hooks.install(state)
    yield ledger
    hooks.uninstall()


@pytest.mark.parametrize("tp_size", [1, 2])
def test_an_elastic_swa_policy_is_refused_at_start_loudly(sglang_env, elastic_policy_hooks, tp_size):
    from kvpolicy.adapters.errors import AdapterError
    from sglang.srt.runtime_context import get_parallel

    with ExitStack() as stack:
        stack.enter_context(single_process_parallel())
        stack.enter_context(get_parallel().override(tp_size=tp_size))
        args = stack.enter_context(published_server_args(max_running_requests=8))
        kvc = kv_cache_configurator(TINY, args)
        with pytest.raises(AdapterError) as info:
            build_pools_through_sglang(kvc)
    message = str(info.value)
    if tp_size > 1:
        assert "needs tensor parallel 1" in message and f"--tp-size {tp_size}" in message
    else:
        assert "`owner elastic`" in message and "p.kvp:2" in message and "owner runtime" in message
    assert elastic_policy_hooks.admitted["cuda:0"] == {}  # refused before anything was admitted
