"""A synthetic scheduler over vLLM 0.33's real KV cache manager, on an elastic pool.

What is real: vLLM's ``KVCacheConfig`` for a real model (planned by vLLM from a local
config.json), vLLM's ``allocate_kv_cache`` building the per-layer views, vLLM's
``KVCacheManager``/coordinator/``BlockPool``/``Request`` and its prefix cache, the
allocator (host driver on a CPU, cuda-python on a GPU) and, where a test passes one,
the shared-memory ledger. What is synthetic: the loop that plays the scheduler's part
(admit with prefix hits, prefill, decode, finish, preempt on a miss — the calls
``Scheduler.schedule`` makes) and the "model", which writes a signature of every token
into its KV slot in the first and the last layer through vLLM's own views, so that
lost or corrupted KV shows up when a request (or a later prefix hit) reads it back.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch

from kvpolicy.adapters.vllm_adapter.elastic.buffer import (
    ElasticKVBuffer,
    allocation_context,
    check_views,
)
from kvpolicy.adapters.vllm_adapter.elastic.layouts import BufferGeometry
from kvpolicy.adapters.vllm_adapter.elastic.pool import ElasticPool, bind_scheduler
from kvpolicy.alloc import Driver, LimitSource


def kv_cache_config(name: str, block_size: int, budget: int, max_model_len: int = 2048, layout: str = "BLHNC") -> Any:
    """vLLM's own plan (in ``layout``) for one rank of ``name`` with ``budget`` bytes."""
    from tests.vllm.real_vllm import Case, real_plan

    case = Case(name, block_size, max_model_len=max_model_len, layout=layout, max_num_batched_tokens=max_model_len)
    cfg = real_plan(case, budget).kv_cache_config
    cfg.kv_cache_layout = layout
    return cfg


def allocate_views(cfg: Any, buffer: ElasticKVBuffer, device: str) -> dict[str, torch.Tensor]:
    """vLLM's ``allocate_kv_cache``, answered by the elastic buffer (the worker's copy of the config:
    layer regions widened to whole chunks in a layer-outermost layout, as the plugin passes it)."""
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    layout = cfg.kv_cache_layout or "BLHNC"
    widened = BufferGeometry.of(cfg, layout).widened(cfg, buffer.chunk)
    ctx = allocation_context(buffer, device)
    with ctx:
        views = allocate_kv_cache(widened, torch.device(device), KVCacheLayout[layout])
    assert ctx.served == 1, "vLLM's buffer allocation was not answered by the elastic buffer"
    check_views(buffer, views)
    return views


def make_buffer(
    cfg: Any, driver: Driver, chunk: int, limit: LimitSource, grow_chunks: int = 1, give_back_chunks: int | None = None
) -> ElasticKVBuffer:
    geometry = BufferGeometry.of(cfg, cfg.kv_cache_layout or "BLHNC")
    return ElasticKVBuffer(
        driver,
        num_blocks=cfg.num_blocks,
        bytes_per_block=geometry.bytes_per_block,
        chunk=chunk,
        limit=limit,
        pinned=geometry.pinned_chunks(chunk) * chunk,
        grow_chunks=grow_chunks,
        regions=geometry.regions,
        block_stride=geometry.block_stride,
        give_back_chunks=give_back_chunks,
    )


def make_manager(cfg: Any, max_model_len: int, enable_caching: bool = True) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.utils.hashing import sha256

    init_none_hash(sha256)
    block_size = max(g.kv_cache_spec.block_size for g in cfg.kv_cache_groups)
    return KVCacheManager(
        cfg,
        max_model_len=max_model_len,
        scheduler_block_size=block_size,
        hash_block_size=min(g.kv_cache_spec.block_size for g in cfg.kv_cache_groups),
        max_in_flight_tokens=max_model_len,
        enable_caching=enable_caching,
    )


def make_request(rid: str, prompt: list[int], max_tokens: int, hash_block_size: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    return Request(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens),
        pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256),
    )


class KVSigner:
    """The synthetic model's KV: a signature of (token, position) per token slot, written and checked
    through vLLM's own per-layer views in the first and the last layer (both ends of every block)."""

    def __init__(self, views: dict[str, torch.Tensor], block_size: int) -> None:
        names = sorted(views)
        self.block_size = block_size
        self.pages = [self._page_view(views[names[0]]), self._page_view(views[names[-1]])]

    def _page_view(self, view: torch.Tensor) -> torch.Tensor:
        """``[num_blocks, page]`` int16 over one layer's pages: each page is one dense run of memory in the
        block-compact layouts (BL…, LB…), whatever the order of heads and tokens inside it."""
        v = view.view(torch.int16) if view.dtype.itemsize == 2 else view.view(torch.int8).view(torch.int16)
        page = v[0].numel()
        span = 1 + sum((n - 1) * st for n, st in zip(v.shape[1:], v.stride()[1:]))
        assert span == page, "a layer's page is not one dense run in this layout"  # no tensor repr: unmapped
        self.per_token = page // self.block_size
        return v.as_strided((v.shape[0], page), (v.stride(0), 1), v.storage_offset())

    def _index(self, block_ids: list[int], tokens: Any, start: int, end: int) -> tuple[torch.Tensor, ...]:
        ids = torch.tensor(block_ids)
        pos = torch.arange(start, end)
        tok = torch.tensor(list(tokens[start:end]))
        rows = ids[pos // self.block_size].unsqueeze(1)
        cols = ((pos % self.block_size) * self.per_token).unsqueeze(1) + torch.arange(4)
        sig = torch.stack([tok & 0x7FFF, pos & 0x7FFF, (tok * 31 + pos) & 0x7FFF, torch.full_like(pos, 0x1234)], 1)
        return rows, cols, sig.to(torch.int16)

    def write(self, block_ids: list[int], tokens: Any, start: int, end: int) -> None:
        if end <= start:
            return
        rows, cols, sig = self._index(block_ids, tokens, start, end)
        for page in self.pages:
            page[rows.to(page.device), cols.to(page.device)] = sig.to(page.device)

    def verify(self, block_ids: list[int], tokens: Any, upto: int, what: str = "request") -> None:
        if upto <= 0:
            return
        rows, cols, sig = self._index(block_ids, tokens, 0, upto)
        for page in self.pages:
            got = page[rows.to(page.device), cols.to(page.device)].cpu()
            if not torch.equal(got, sig):
                bad = int((got != sig).any(1).nonzero()[0])
                raise AssertionError(
                    f"KV of {what} token {bad} (block {int(rows[bad])}) is {got[bad].tolist()}, "
                    f"expected {sig[bad].tolist()}: lost or corrupted"
                )


@dataclass
class Stats:
    steps: int = 0
    admitted: int = 0
    finished: int = 0
    misses: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    verified_tokens: int = 0


@dataclass(repr=False)  # never repr the views: printing them reads unmapped memory (a fault, as on a GPU)
class Loop:
    """The synthetic scheduler. ``step()`` is one engine step: schedule, "run the model", finish, ``on_step``."""

    manager: Any
    views: dict[str, torch.Tensor]
    pool: ElasticPool | Any
    block_size: int
    max_model_len: int
    rng: random.Random
    max_running: int = 8
    max_new_tokens: int = 96
    prompts: list[list[int]] = field(default_factory=list)
    waiting: list[Any] = field(default_factory=list)
    running: list[Any] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    elastic: bool = True
    verify_every: int = 1
    _next: int = 0

    def __repr__(self) -> str:
        return f"Loop({self.stats}, {len(self.running)} running, {len(self.waiting)} waiting)"

    def __post_init__(self) -> None:
        self.signer = KVSigner(self.views, self.block_size)
        # A few shared prompt prefixes, so that later requests hit the prefix cache.
        for _ in range(6):
            self.prompts.append([self.rng.randrange(1, 30000) for _ in range(self.rng.randrange(8, 6 * self.block_size))])

    def _write(self, req: Any, start: int, end: int) -> None:
        self.signer.write(self.manager.get_block_ids(req.request_id)[0], req.all_token_ids, start, end)

    def _verify(self, req: Any, upto: int) -> None:
        self.signer.verify(self.manager.get_block_ids(req.request_id)[0], req.all_token_ids, upto, req.request_id)
        self.stats.verified_tokens += upto

    # -- scheduling -----------------------------------------------------------------------
    def submit(self, max_tokens: int | None = None) -> Any:
        base = self.rng.choice(self.prompts)
        tail = [self.rng.randrange(1, 30000) for _ in range(self.rng.randrange(1, 2 * self.block_size))]
        prompt = (base + tail)[: self.max_model_len // 2]
        longest = min(self.max_new_tokens, self.max_model_len - len(prompt) - 1)
        max_tokens = max_tokens or self.rng.randrange(1, max(2, longest))
        req = make_request(f"r{self._next}", prompt, max_tokens, self.manager.coordinator.block_pool.hash_block_size)
        self._next += 1
        self.waiting.append(req)
        return req

    def _preempt(self) -> None:
        from vllm.v1.request import RequestStatus

        victim = self.running.pop()
        self.manager.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        self.waiting.insert(0, victim)
        self.stats.preemptions += 1

    def step(self) -> None:
        from vllm.v1.request import RequestStatus

        self.stats.steps += 1
        # Running requests decode one token each (preempting the newest on a miss, as vLLM does).
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if self.manager.allocate_slots(req, 1) is None:
                self.stats.misses += 1
                if len(self.running) - 1 > i:
                    self._preempt()
                    continue
                self._preempt_self(req)
                continue
            i += 1
        # Admit waiting requests while there is room.
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            computed, num_computed, _ = self.manager.get_computed_blocks(req)
            num_new = req.num_tokens - num_computed
            new = self.manager.allocate_slots(
                req, num_new, num_new_computed_tokens=num_computed, new_computed_blocks=computed,
                full_sequence_must_fit=False, has_scheduled_reqs=bool(self.running),
            )
            if new is None:
                self.stats.misses += 1
                break
            self.waiting.pop(0)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self.stats.admitted += 1
            self.stats.prefix_hit_tokens += num_computed
            if num_computed:
                self._verify(req, num_computed)  # prefix-cache hits carry the KV written by others
            self._write(req, num_computed, req.num_tokens)
            req.num_computed_tokens = req.num_tokens
        # "Sample" a token for every running request that is caught up; finish some.
        for req in list(self.running):
            if req.num_computed_tokens < req.num_tokens:
                self._write(req, req.num_computed_tokens, req.num_tokens)
                req.num_computed_tokens = req.num_tokens
            if self.stats.steps % self.verify_every == 0:
                self._verify(req, req.num_computed_tokens)
            done = req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len - 1
            if done:
                self.manager.free(req)
                self.running.remove(req)
                self.stats.finished += 1
            else:
                req.append_output_token_ids(self.rng.randrange(1, 30000))
        if self.elastic:
            self.pool.on_step(active=bool(self.running or self.waiting))

    def _preempt_self(self, req: Any) -> None:
        from vllm.v1.request import RequestStatus

        self.running.remove(req)
        self.manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.waiting.insert(0, req)
        self.stats.preemptions += 1

    def drain(self) -> None:
        """Finish every request (no new ones)."""
        for req in self.running:
            self.manager.free(req)
        self.running.clear()
        self.waiting.clear()
        if self.elastic:
            self.pool.on_step(active=False)


def build(
    name: str,
    block_size: int,
    budget: int,
    driver: Driver,
    chunk: int,
    limit: LimitSource,
    *,
    device: str = "cpu",
    max_model_len: int = 1024,
    seed: int = 0,
    grow_chunks: int = 1,
    enable_caching: bool = True,
    layout: str = "BLHNC",
    give_back_chunks: int | None = None,
    **pool_options: Any,
) -> tuple[Loop, ElasticKVBuffer]:
    cfg = kv_cache_config(name, block_size, budget, max_model_len, layout)
    buffer = make_buffer(cfg, driver, chunk, limit, grow_chunks, give_back_chunks)
    views = allocate_views(cfg, buffer, device)
    manager = make_manager(cfg, max_model_len, enable_caching)
    pool = bind_scheduler(manager, buffer, give_back_interval=pool_options.pop("give_back_interval", 0.0), **pool_options)
    loop = Loop(manager, views, pool, block_size=block_size, max_model_len=max_model_len, rng=random.Random(seed))
    return loop, buffer
