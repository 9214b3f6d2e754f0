"""DeepSeek-V4's SWA KV pool on the elastic allocator (SGLang 0.5.23): memory mapped as pages are handed out.

SGLang keeps the sliding-window KV of every layer in one ``[pages, page_bytes]`` uint8
tensor per layer (``DeepSeekV4SingleKVPool.kv_buffer``) and hands its pages out through
a ``PagedTokenToKVPoolAllocator`` (the ``swa_attn_allocator`` of its
``SWATokenToKVPoolAllocator``), whose free list is a tensor of page ids. ``ElasticSWA``
puts those tensors on the allocator:

- each layer's tensor is a view over one virtual reservation (an arena of a
  ``ChunkMapping``); chunk ``c`` is mapped in every layer together, and zero-filled
  when mapped (SGLang builds the pool with ``torch.zeros``); unmapped memory is never
  touched;
- SGLang's free list holds only pages whose chunks are mapped (*visible* pages).
  Before SGLang's allocator hands pages out, ``ensure`` maps chunks under the limit and
  makes their pages visible; a growth the limit (or the GPU) refuses leaves the free
  list short, and SGLang's own check fails the allocation as it does when its pool is
  full (``None``: the scheduler retracts or queues);
- ``available_size`` reports the visible free pages plus the pages the limit in force
  would still let it map, so the scheduler admits what can be mapped and no more;
- the pages SGLang hands out are the live blocks of the mapping (``LiveBlocks``),
  with page 0 — SGLang's padding page, written for padded tokens — live for good: the
  chunks it touches are *pinned* (mapped at start, admitted as runtime-owned memory,
  ``limits.PinnedFirst``-style accounting by the caller's limit source);
- the ids of the pages handed out and freed stay on the device until something must
  know which chunks are free (``settle``: before a give-back, a new limit revision, a
  deferred limit's frees, or after ``UNREAD_AT_MOST`` calls): reading them on the host
  is a copy that waits for the kernels queued before it, which SGLang's allocator is
  written to avoid. Their number is known on the host at once, so the bytes in use are
  always exact;
- ``tick`` runs between scheduler steps, from the allocator entry points SGLang's
  scheduler calls every round (``available_size``, ``swa_available_size``, and
  ``swa_capacity_and_available``, which the idle loop's leak check calls): a new limit
  revision is applied at once; at most every ``give_back_interval`` seconds ``sync``
  gives back fully free chunks above the target or under pressure (``GiveBack``; with
  ``give_back_chunks`` it unmaps at most that many chunks a tick, in whole chunk groups of one
  chunk per layer, at least one, the rest at the next ticks); at
  most every ``report_interval`` seconds the bytes in use go to the ledger. A lowered
  limit is applied at once or deferred until pages are freed (each free that empties a
  chunk then unmaps it); a chunk about to be unmapped first has its pages taken out of
  SGLang's free list, and the device finishes the kernels in flight (``before_unmap``:
  with the overlap scheduler a step may still read pages freed a step ago).

``swa_backed_by`` builds the real ``DeepSeekV4TokenToKVPool`` with its SWA tensors over
an ``ElasticSWA``; ``bind`` binds the ``SWATokenToKVPoolAllocator`` SGLang builds over
that pool (``attach``: its SWA page allocator; ``wrap_swa_allocator``: its checks).
Imports torch (and sglang, for ``get_num_new_pages``) when used.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvpolicy.alloc import (
    ChunkGrid,
    ChunkMapping,
    DriverError,
    GiveBack,
    LimitSource,
    LiveBlocks,
    OutOfBlocks,
    groups_within,
)
from kvpolicy.alloc.mapping import plan_growth
from kvpolicy.facts import PoolFacts
from kvpolicy.units import format_bytes

from ..errors import AdapterError

logger = logging.getLogger("kvpolicy.adapters.sglang_dsv4")

PADDING_PAGE = 0
"""SGLang's paged allocator never hands out page 0: padded tokens write there."""
OTHER_POOL = "other"
PINNED_PART = "swa_pinned"
"""The pinned chunks of the elastic SWA pool, reported as runtime-owned memory under ``other``."""
UNREAD_AT_MOST = 256
"""Allocator calls whose page ids may wait on the device before the pool reads them (one copy for all)."""


class ElasticSWA:
    """The SWA KV tensors of one DeepSeek-V4 pool over ``layers`` arenas of ``pages`` pages each.

    ``limit`` is the instance's limit source: the pinned chunks come first (a caller that
    admits them statically wraps the ledger's source so that they do not count as
    elastic, as the vLLM adapter's ``PinnedFirst`` does). Not thread-safe: SGLang's
    scheduler drives its allocator from one thread.
    """

    def __init__(
        self,
        driver: Any,
        *,
        layers: int,
        pages: int,
        page_bytes: int,
        chunk: int,
        limit: LimitSource,
        grow_chunks: int = 1,
        name: str = "sglang-swa",
        give_back_interval: float = 1.0,
        report_interval: float = 1.0,
        give_back_chunks: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pages < 2:
            raise ValueError(f"an SWA pool needs the padding page and at least one more, got {pages} pages")
        self.layers, self.pages, self.page_bytes, self.chunk = layers, pages, page_bytes, chunk
        self.grid = ChunkGrid(page_bytes, chunk, pages)
        self.grow_chunks = grow_chunks
        self.driver = driver
        self._unread: list[tuple[bool, Any]] = []  # (taken, device tensor of page ids), in call order
        self._unread_pages = 0  # pages taken minus pages freed among them
        self.mapping = ChunkMapping(
            driver, self.grid, limit=limit, num_arenas=layers, name=name,
            before_unmap=self._before_unmap, zero_new_chunks=True, used_bytes=lambda: self.used_bytes,
        )
        self.live = LiveBlocks(self.mapping)
        self.give_back = GiveBack(group_bytes=self.mapping.group_bytes, grow_chunks=grow_chunks,
                                  pressure=limit.pressure(), release_chunks=groups_within(give_back_chunks, layers))
        self.visible = bytearray(pages)
        """1 for each page that is SGLang's: in its free list, or handed out."""
        self.allocator: Any = None
        """SGLang's SWA page allocator, once ``attach``\\ ed."""
        self.refusals = 0
        """Growths the limit, the ledger or the GPU refused (each an ordinary SGLang allocation failure)."""
        self.give_back_interval, self.report_interval = give_back_interval, report_interval
        self.on_report: Callable[[], None] | None = None
        """Called at most every ``report_interval`` (the adapter reports the pools' facts to the ledger)."""
        self.on_activity: Callable[[], None] | None = None
        """Called at a report when pages were handed out since the last one (the ledger's ``idle_seconds``)."""
        self.handouts = 0
        """Allocations that took pages (cumulative)."""
        self._clock = clock
        self._last_give_back = self._last_report = clock()
        self._handouts_reported = 0
        self._short = False  # a growth was refused: report no mappable pages until memory is freed or the limit moves
        self._short_revision: int | None = None
        self._mappable_key: tuple[int, int, int, int] | None = None  # mappable_pages' answer, until this changes
        self._mappable = 0
        try:
            self.live.claim([PADDING_PAGE])  # maps (and zeroes) the pinned chunks
        except BaseException:
            self.mapping.close()
            raise
        self.pinned = self.mapping.held_bytes
        self._show(self.grid.completed_by(self.grid.chunks_of(PADDING_PAGE), self.mapping.mapped))

    # -- state ---------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        """Bytes of the pages SGLang has handed out, over all layers (the padding page left out)."""
        live = getattr(self, "live", None)  # the mapping reports while it is built, before any page is live
        return max(0, live.count + self._unread_pages - 1) * self.page_bytes * self.layers if live is not None else 0

    @property
    def held_bytes(self) -> int:
        return self.mapping.held_bytes

    @property
    def elastic_bytes(self) -> int:
        """Bytes held beyond the pinned chunks: what the elastic budget counts."""
        return max(0, self.held_bytes - self.pinned)

    @property
    def unread_calls(self) -> int:
        """Allocator calls whose page ids wait on the device (``settle`` reads them)."""
        return len(self._unread)

    def page_is_mapped(self, page: int) -> bool:
        mapped = self.mapping.mapped
        return all(mapped[c] for c in self.grid.chunks_of(page))

    def views(self) -> list[Any]:
        """Per layer, SGLang's ``[pages, page_bytes]`` uint8 tensor, a view over that layer's reservation."""
        from kvpolicy.alloc.tensors import arena_bytes

        n = self.pages * self.page_bytes
        return [arena_bytes(a)[:n].view(self.pages, self.page_bytes) for a in self.mapping.arenas]

    def facts(self) -> dict[str, PoolFacts]:
        """``swa`` as an elastic pool (bytes: mapped beyond the pinned chunks; tensor bytes: pages in use) and
        the pinned chunks as runtime-owned memory under ``other``."""
        return {
            "swa": PoolFacts(owner="elastic", bytes=self.elastic_bytes, tensor_bytes=self.used_bytes),
            OTHER_POOL: PoolFacts(owner="runtime", bytes=self.pinned, tensor_bytes=self.pinned,
                                  parts={PINNED_PART: self.pinned}),
        }

    # -- SGLang's free list ---------------------------------------------------------------
    def _free_list(self) -> Any:
        a = self.allocator
        if a.staged_pages:
            a.merge_and_sort_free()  # one sorted list: page ids leave it only from the front
        return a.free_pages

    def _show(self, pages: Sequence[int]) -> None:
        """Hand newly mapped pages to SGLang's free list (sorted, so low addresses go out first)."""
        import torch

        new = [p for p in pages if p != PADDING_PAGE and not self.visible[p]]
        if not new:
            return
        for p in new:
            self.visible[p] = 1
        if self.allocator is not None:
            free = self._free_list()
            added = torch.tensor(new, dtype=free.dtype, device=free.device)
            self.allocator.free_pages = torch.sort(torch.cat((free, added)))[0]

    def _before_unmap(self, chunks: list[int]) -> None:
        self._hide_chunks(chunks)
        self.driver.synchronize()  # kernels still reading these chunks (the overlap scheduler) finish first

    def _hide_chunks(self, chunks: list[int]) -> None:
        """``before_unmap``: take the pages touching ``chunks`` out of SGLang's free list (none is live)."""
        import torch

        going = sorted({p for c in chunks for p in self.grid.blocks_touching(c) if self.visible[p]})
        if not going:
            return
        assert not any(self.live.is_live(p) for p in going), "unmapping a page SGLang holds"
        for p in going:
            self.visible[p] = 0
        if self.allocator is not None:
            free = self._free_list()
            drop = torch.tensor(going, dtype=free.dtype, device=free.device)
            self.allocator.free_pages = free[~torch.isin(free, drop)]

    def visible_pages(self) -> int:
        """Pages SGLang can hold now: in its free list or handed out (the padding page left out)."""
        return sum(self.visible) - self.visible[PADDING_PAGE]

    def mappable_pages(self) -> int:
        """Pages that mapping more chunks under the limit in force would make visible.

        SGLang asks for it several times a step (every ``available_size``): the answer is kept
        until the limit or the mapping changes (a map or unmap moves the mapping's counters)."""
        if self._short and self._short_revision == self.mapping.reading.revision:
            return 0
        m = self.mapping
        reading = m.read()
        held = m.held_bytes
        key = (reading.limit, held, m.groups_mapped, m.groups_unmapped)
        if key == self._mappable_key:
            return self._mappable
        room = reading.limit - held
        groups = max(0, room // m.group_bytes)
        gained = 0
        if groups:
            _, gained = plan_growth(self.grid, m.mapped, 0, start=m.low_unmapped, at_least=groups,
                                    fits=lambda count: count <= groups)
        self._mappable_key, self._mappable = key, gained
        return gained

    def ensure(self, pages: int) -> bool:
        """Make at least ``pages`` free pages visible to SGLang, mapping chunks under the limit; False if
        the limit, the ledger or the GPU refuses (SGLang then fails the allocation as a full pool)."""
        free = len(self._free_list())
        if free >= pages:
            return True
        m = self.mapping
        try:
            self.settle()  # a new limit revision may unmap free chunks: the pool must know which are free
            m.refresh()  # a new limit revision first (it may shrink, hiding pages)
            free = len(self._free_list())
            if free >= pages:
                return True
            missing = pages - free
            chosen = m.grow(missing, at_least=self.grow_chunks, requested=pages, free=free)
        except OutOfBlocks as exc:
            self._refused(f"{exc.reason}: {exc}")
            return False
        except DriverError as exc:
            self._refused(f"driver: {exc}")
            return False
        self._show(self.grid.completed_by(chosen, m.mapped))
        return len(self._free_list()) >= pages

    def ensure_within(self, at_most: int, pages: Callable[[], int]) -> bool:
        """``ensure(pages())``, without counting the pages when ``at_most`` (a bound on the count) are
        free already: the count is SGLang's ``get_num_new_pages``, tensor work that costs as much as the
        allocation, and a decode step needs at most one new page per request."""
        if len(self._free_list()) >= at_most:
            return True
        return self.ensure(pages())

    def _refused(self, why: str) -> None:
        self.refusals += 1
        self._short, self._short_revision = True, self.mapping.reading.revision
        logger.debug("kvpolicy: SWA growth refused (%s); SGLang sees a full SWA pool", why)

    # -- what SGLang's allocator did -----------------------------------------------------------
    def handed_out(self, pages: Any) -> None:
        """SGLang's allocator took ``pages`` (a tensor of page ids, all mapped) from its free list: they are live."""
        if pages.numel():
            self.handouts += 1
            self._note(True, pages)

    def returned(self, pages: Any) -> None:
        """SGLang freed ``pages`` (a tensor of page ids) back into its free list; a deferred limit may then unmap some."""
        if pages.numel():
            self._short = False
            self._note(False, pages)
            if self.mapping.deferred:
                self.settle()  # the frees complete the lowered limit as they come

    def _note(self, taken: bool, pages: Any) -> None:
        self._unread.append((taken, pages))
        self._unread_pages += pages.numel() if taken else -pages.numel()
        if len(self._unread) >= UNREAD_AT_MOST:
            self.settle()

    def settle(self) -> None:
        """Read the page ids handed out and freed since the last read (one copy from the device) and make
        the live pages those SGLang holds; claims go first, so no chunk looks free while a page in it is held."""
        if not self._unread:
            return
        import torch

        calls, self._unread, self._unread_pages = self._unread, [], 0
        ids = torch.cat([pages.reshape(-1) for _, pages in calls]).tolist()
        held: dict[int, bool] = {}  # each page's last call says whether SGLang holds it now
        at = 0
        for taken, pages in calls:
            n = pages.numel()
            held.update(dict.fromkeys(ids[at:at + n], taken))
            at += n
        self.live.reconcile([p for p, h in held.items() if h], [p for p, h in held.items() if not h])

    def sync(self) -> None:
        """Apply the limit in force, give back free chunks above the target or under pressure, report."""
        self.settle()
        self.give_back.sync(self.mapping, self.used_bytes)
        if self.mapping.reading.revision != self._short_revision:
            self._short = False

    def tick(self) -> None:
        """Between scheduler steps: a new limit revision at once; a give-back when due and there is
        something to give back (above the target, or another instance under pressure); a report when due."""
        m = self.mapping
        now = self._clock()
        reading = m.limit.read()
        # A give-back the bound held back goes on at the next tick, not an interval later.
        due = now - self._last_give_back >= self.give_back_interval or self.give_back.held_back
        if reading.revision != m.revision or (
            due and (m.held_bytes > reading.target or self.give_back.pressed(m.limit.pressure()))
        ):
            try:
                self.sync()
            except DriverError as exc:  # the pool stays true to the driver; the next tick retries
                logger.error("kvpolicy: giving SWA memory back failed (retried next step): %s", exc)
            self._last_give_back = now
        if now - self._last_report >= self.report_interval:
            self._last_report = now
            self.report()

    def report(self) -> None:
        """The bytes in use and held to the limit source, activity, and the adapter's facts."""
        self.mapping.report()
        self.mapping.new_period()
        if self.handouts != self._handouts_reported and self.on_activity is not None:
            self.on_activity()
        self._handouts_reported = self.handouts
        if self.on_report is not None:
            self.on_report()

    def close(self) -> None:
        self.mapping.close()

    def __repr__(self) -> str:
        return (
            f"ElasticSWA({self.layers} layers x {self.pages} pages of {self.page_bytes} B, "
            f"{format_bytes(self.held_bytes)} held, {format_bytes(self.pinned)} pinned, {self.live.count - 1} pages in use)"
        )

    # -- binding SGLang's SWA page allocator ------------------------------------------------------
    def attach(self, allocator: Any) -> None:
        """Bind SGLang's ``PagedTokenToKVPoolAllocator`` over this pool (the SWA side of its
        ``SWATokenToKVPoolAllocator``): its free list becomes the visible pages, and its page
        hand-outs and frees pass through this pool."""
        if allocator.num_pages + 1 != self.pages:
            raise AdapterError(
                f"kvpolicy: SGLang's SWA allocator has {allocator.num_pages} pages, the elastic SWA pool "
                f"{self.pages - 1} (+ the padding page); this SGLang differs from the validated one"
            )
        self.allocator = allocator
        _wrap_page_allocator(allocator, self)
        allocator.clear()

    def bind(self, outer: Any) -> None:
        """Bind SGLang's ``SWATokenToKVPoolAllocator`` over this pool: its SWA page allocator (``attach``),
        its SWA allocations mapped first and refused as a full pool, its capacity figures under the limit
        in force, and ``tick`` at the entry points its scheduler calls every round (``wrap_swa_allocator``)."""
        self.attach(outer.swa_attn_allocator)
        wrap_swa_allocator(outer, self)


def _ensure(pool: ElasticSWA, pages: Callable[..., int], at_most: Callable[..., int] | None,
            args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``pool.ensure`` for an allocator call's pages; with ``at_most`` (a cheap bound), counted only if needed."""
    if at_most is None:
        return pool.ensure(pages(*args, **kwargs))
    return pool.ensure_within(at_most(*args, **kwargs), lambda: pages(*args, **kwargs))


def _pages_taken(before: Any, after: Any) -> Any | None:
    """The ids SGLang's paged allocator took off the front of its free list, None if it took none (most
    decode steps: no tensor work then). A copy: the list's storage is not kept alive while the ids wait."""
    taken = len(before) - len(after)
    return before[:taken].clone() if taken else None


def _wrap_page_allocator(a: Any, pool: ElasticSWA) -> None:
    """Instance-level wrappers on SGLang's paged allocator: growth before hand-outs, bookkeeping after."""
    from sglang.srt.utils.common import get_num_new_pages

    P = a.page_size
    original: dict[str, Callable[..., Any]] = {
        name: getattr(a, name) for name in ("clear", "available_size", "alloc", "alloc_extend", "alloc_decode",
                                            "_release_page_ids")
    }

    def clear() -> None:
        original["clear"]()
        pool.settle()
        if pool.live.count > 1:  # SGLang forgets every allocation: so does the pool
            pool.live.release([p for p in range(1, pool.pages) if pool.live.is_live(p)])
        import torch

        visible = [p for p in range(1, pool.pages) if pool.visible[p]]
        a.free_pages = torch.tensor(visible, dtype=a.free_pages.dtype, device=a.free_pages.device)

    def available_size() -> int:
        return original["available_size"]() + pool.mappable_pages() * P

    def taking(name: str, pages: Callable[..., int], at_most: Callable[..., int] | None = None) -> Callable[..., Any]:
        call = original[name]

        @functools.wraps(call)
        def method(*args: Any, **kwargs: Any) -> Any:
            _ensure(pool, pages, at_most, args, kwargs)
            before = pool._free_list()
            out = call(*args, **kwargs)
            taken = _pages_taken(before, a.free_pages)
            if taken is not None:
                pool.handed_out(taken)
            return out

        return method

    def extend_pages(prefix_lens: Any, prefix_lens_cpu: Any, seq_lens: Any, seq_lens_cpu: Any, last_loc: Any,
                     extend_num_tokens: Any, num_new_pages: Any = None) -> int:
        if num_new_pages is not None:
            return int(num_new_pages)
        return int(get_num_new_pages(seq_lens=seq_lens_cpu, page_size=P, prefix_lens=prefix_lens_cpu))

    def decode_pages(seq_lens: Any, seq_lens_cpu: Any, last_loc: Any) -> int:
        return int(get_num_new_pages(seq_lens=seq_lens_cpu, page_size=P, decode=True))

    def decode_pages_at_most(seq_lens: Any, seq_lens_cpu: Any, last_loc: Any) -> int:
        return len(seq_lens_cpu)

    def release(*page_ids: Any) -> None:
        original["_release_page_ids"](*page_ids)
        for ids in page_ids:
            pool.returned(ids)

    a.clear = clear
    a.available_size = available_size
    a.alloc = taking("alloc", lambda need_size: need_size // P)
    a.alloc_extend = taking("alloc_extend", extend_pages)
    a.alloc_decode = taking("alloc_decode", decode_pages, at_most=decode_pages_at_most)
    a._release_page_ids = release


def wrap_swa_allocator(outer: Any, pool: ElasticSWA) -> None:
    """Instance-level wrappers on SGLang's ``SWATokenToKVPoolAllocator``.

    - It asserts that its SWA side succeeds once its own check passed: map the SWA pages
      first, and fail the allocation (``None``) before that check when the limit refuses
      them, so a refusal is never an assertion in SGLang.
    - Its capacity figures (``swa_capacity_and_available``, which the idle loop's leak
      check reads) say the SWA capacity under the limit in force: the pages SGLang can
      hold now plus those it could still map, so that capacity = available + used holds.
    - ``available_size``, ``swa_available_size`` and ``swa_capacity_and_available`` (the
      scheduler asks one of them every round, never inside an allocation) ``tick`` first.
    """
    from sglang.srt.utils.common import get_num_new_pages

    P = outer.page_size

    def ticking(name: str) -> None:
        call = getattr(outer, name)

        @functools.wraps(call)
        def method(*args: Any, **kwargs: Any) -> Any:
            pool.tick()
            return call(*args, **kwargs)

        setattr(outer, name, method)

    ticking("available_size")
    ticking("swa_available_size")
    capacity_and_available = outer.swa_capacity_and_available

    @functools.wraps(capacity_and_available)
    def swa_capacity_and_available(*, full_capacity: int, swa_capacity: int) -> Any:
        pool.tick()
        full, (_, available) = capacity_and_available(full_capacity=full_capacity, swa_capacity=swa_capacity)
        return full, (min(swa_capacity, (pool.visible_pages() + pool.mappable_pages()) * P), available)

    outer.swa_capacity_and_available = swa_capacity_and_available

    def guarded(name: str, pages: Callable[..., int], at_most: Callable[..., int] | None = None) -> None:
        call = getattr(outer, name)

        @functools.wraps(call)
        def method(*args: Any, **kwargs: Any) -> Any:
            return call(*args, **kwargs) if _ensure(pool, pages, at_most, args, kwargs) else None

        setattr(outer, name, method)

    guarded("alloc_extend", lambda prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, *rest, **kw: int(
        get_num_new_pages(seq_lens=seq_lens_cpu, page_size=P, prefix_lens=prefix_lens_cpu)),
        # SGLang's own bound, from host integers: a request's page count grows by at most its new tokens // P + 1
        at_most=lambda prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens: (
            int(extend_num_tokens) // P + len(prefix_lens_cpu) + 1))
    guarded("alloc_extend_swa_tail", lambda *args, swa_tail_len=None, **kw: -(-int(
        swa_tail_len if swa_tail_len is not None else args[6]) // P))
    guarded("alloc_decode", lambda seq_lens, seq_lens_cpu, last_loc: int(
        get_num_new_pages(seq_lens=seq_lens_cpu, page_size=P, decode=True)),
        at_most=lambda seq_lens, seq_lens_cpu, last_loc: len(seq_lens_cpu))  # one new page per request at most


@contextlib.contextmanager
def swa_backed_by(make: Callable[[int, int, int], ElasticSWA]) -> Iterator[list[ElasticSWA]]:
    """While open, a ``DeepSeekV4TokenToKVPool`` built in this process gets its SWA tensors from
    ``make(layers, pages, page_bytes)`` instead of ``torch.zeros``; yields the pools made (one per
    V4 pool built). The compressed, indexer and state pools are built as SGLang builds them."""
    from sglang.srt.mem_cache import deepseek_v4_memory_pool as mod

    made: list[ElasticSWA] = []
    cls = mod.DeepSeekV4TokenToKVPool
    original = cls._make_kv_pool

    def _make_kv_pool(self: Any, *, size: int, cls: type = mod.DeepSeekV4SingleKVPool, **kwargs: Any) -> Any:
        if getattr(self, "_kvpolicy_swa", None) is not None or size != self.swa_size:
            return original(self, size=size, cls=cls, **kwargs)
        backed = _backed_class(cls, make, made)
        pool = original(self, size=size, cls=backed, **kwargs)
        self._kvpolicy_swa = made[-1]
        return pool

    cls._make_kv_pool = _make_kv_pool
    try:
        yield made
    finally:
        cls._make_kv_pool = original


@functools.cache
def _backed_type(base: type) -> type:
    class ElasticSWAKVPool(base):
        """SGLang's SWA pool whose per-layer tensors are views over an ``ElasticSWA``."""

        def _create_buffers(self) -> None:
            from sglang.srt.mem_cache.deepseek_v4_memory_pool import _num_dsv4_physical_kv_pages

            pages = _num_dsv4_physical_kv_pages(self.size, self.page_size, self.global_page_size)
            page_bytes = self.kv_layout.page_bytes(self.page_size)
            self.kv_cache_total_dim = self.get_bytes_per_token()
            self.bytes_per_page_padded = page_bytes
            self._kvpolicy_elastic = self._kvpolicy_make(self.layer_num, pages, page_bytes)
            self._kvpolicy_made.append(self._kvpolicy_elastic)
            self.kv_buffer = self._kvpolicy_elastic.views()

    ElasticSWAKVPool.__qualname__ = f"ElasticSWA{base.__name__}"
    return ElasticSWAKVPool


def _backed_class(base: type, make: Callable[[int, int, int], ElasticSWA], made: list[ElasticSWA]) -> type:
    """A per-build subclass carrying ``make`` and ``made`` (the pool's ``__init__`` calls ``_create_buffers``)."""
    return type(_backed_type(base).__name__, (_backed_type(base),), {"_kvpolicy_make": staticmethod(make),
                                                                     "_kvpolicy_made": made})
