"""A synthetic scheduler on vLLM's real ``BlockPool`` API, for the CPU (host driver) and the GPU (cuda-python).

It makes the calls vLLM's KV cache manager makes on the block pool — ``get_cached_block``
for prefix hits, ``touch``, ``get_new_blocks``, ``cache_full_blocks``, ``free_blocks`` in
reverse order — with the elastic pool's ``make_room`` where vLLM's allocation check is
(see ``elastic.pool.bind_scheduler``): admit (with prefix hits), prefill, decode,
finish, preempt on a miss. It needs only ``vllm.v1.core.block_pool`` (and what that
imports), so the same loop runs on the GPU machine, where vLLM's package cannot be
installed. The "model" writes a signature of each token into its block (at both ends
of the block, so both chunks of a straddling block are covered) through a tensor over
the buffer, and every request's KV — and every prefix hit's — is read back and checked.

Imports torch and vllm; use from tests and benchmarks only.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import torch


def block_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """Chained hashes of the full blocks of ``tokens`` (vLLM's BlockHash is bytes)."""
    out: list[bytes] = []
    prev = b""
    for i in range(len(tokens) // block_size):
        chunk = tokens[i * block_size : (i + 1) * block_size]
        prev = hashlib.sha256(prev + b",".join(str(t).encode() for t in chunk)).digest()
        out.append(prev)
    return out


@dataclass(eq=False)
class Req:
    rid: str
    tokens: list[int]
    max_tokens: int
    prompt_len: int
    blocks: list[Any] = field(default_factory=list)
    computed: int = 0
    cached_blocks: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    """Read by vLLM's ``BlockPool.cache_full_blocks`` (the only Request field it uses without events)."""


@dataclass
class PoolStats:
    steps: int = 0
    admitted: int = 0
    finished: int = 0
    misses: int = 0
    preemptions: int = 0
    hit_blocks: int = 0
    verified_tokens: int = 0


class PoolLoop:
    """The synthetic scheduler over ``pool`` (vLLM's BlockPool, elastic or stock) and ``data`` (the buffer)."""

    def __init__(
        self,
        pool: Any,
        data: torch.Tensor,
        bytes_per_block: int,
        block_size: int,
        *,
        seed: int = 0,
        max_running: int = 8,
        max_new_tokens: int = 64,
        max_len: int = 512,
        verify: bool = True,
    ) -> None:
        from kvpolicy.adapters.vllm_adapter.elastic.pool import elastic_of

        self.pool = pool
        self.elastic = elastic_of(pool)
        """The ElasticPool beside ``pool``; None for a stock pool."""
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.max_running = max_running
        self.max_new_tokens = max_new_tokens
        self.max_len = max_len
        self.verify_kv = verify
        words = bytes_per_block // 2
        self.words = data.view(torch.int16)[: pool.num_gpu_blocks * words].view(pool.num_gpu_blocks, words)
        self.per_token = words // block_size // 2
        self.tail = words - block_size * 4  # the block's last bytes: the other end of a straddling block
        self.prompts = [[self.rng.randrange(1, 30000) for _ in range(self.rng.randrange(8, 6 * block_size))] for _ in range(6)]
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.stats = PoolStats()
        self._next = 0

    # -- the "model" ----------------------------------------------------------------------
    def _index(self, req: Req, start: int, end: int) -> tuple[torch.Tensor, ...]:
        ids = torch.tensor([b.block_id for b in req.blocks])
        pos = torch.arange(start, end)
        tok = torch.tensor(req.tokens[start:end])
        rows = ids[pos // self.block_size].unsqueeze(1)
        slot = pos % self.block_size
        head = (slot * self.per_token).unsqueeze(1) + torch.arange(4)
        tail = (self.tail + slot * 4).unsqueeze(1) + torch.arange(4)
        sig = torch.stack([tok & 0x7FFF, pos & 0x7FFF, (tok * 31 + pos) & 0x7FFF, torch.full_like(pos, 0x2345)], 1)
        return rows, head, tail, sig.to(torch.int16)

    def _write(self, req: Req, start: int, end: int) -> None:
        if end <= start:
            return
        rows, head, tail, sig = self._index(req, start, end)
        dev = self.words.device
        rows, sig = rows.to(dev), sig.to(dev)
        self.words[rows, head.to(dev)] = sig
        self.words[rows, tail.to(dev)] = sig

    def _verify(self, req: Req, upto: int) -> None:
        if upto <= 0 or not self.verify_kv:
            return
        rows, head, tail, sig = self._index(req, 0, upto)
        dev = self.words.device
        for cols in (head, tail):
            got = self.words[rows.to(dev), cols.to(dev)].cpu()
            if not torch.equal(got, sig):
                bad = int((got != sig).any(1).nonzero()[0])
                raise AssertionError(
                    f"KV of {req.rid} token {bad} (block {int(rows[bad])}) is {got[bad].tolist()}, "
                    f"expected {sig[bad].tolist()}: lost or corrupted"
                )
        self.stats.verified_tokens += upto

    # -- the block pool calls vLLM's KV cache manager makes ------------------------------
    def _room(self, n: int) -> bool:
        if self.elastic is not None:
            self.elastic.make_room(n)
        return n <= self.pool.get_num_free_blocks()

    def _free(self, req: Req) -> None:
        self.pool.free_blocks(reversed(req.blocks))
        req.blocks = []
        req.computed = req.cached_blocks = 0

    def _cache(self, req: Req) -> None:
        full = req.computed // self.block_size
        if full > req.cached_blocks:
            req.block_hashes = block_hashes(req.tokens[: full * self.block_size], self.block_size)
            self.pool.cache_full_blocks(req, req.blocks, req.cached_blocks, full, self.block_size, 0)
            req.cached_blocks = full

    def submit(self, max_tokens: int | None = None) -> Req:
        prompt = (self.rng.choice(self.prompts) + [self.rng.randrange(1, 30000) for _ in range(self.rng.randrange(1, 2 * self.block_size))])
        prompt = prompt[: self.max_len // 2]
        n = max_tokens or self.rng.randrange(1, max(2, min(self.max_new_tokens, self.max_len - len(prompt) - 1)))
        req = Req(f"r{self._next}", list(prompt), n, len(prompt))
        self._next += 1
        self.waiting.append(req)
        return req

    def _admit(self, req: Req) -> bool:
        hits: list[Any] = []
        for h in block_hashes(req.tokens[: len(req.tokens) - 1], self.block_size):
            found = self.pool.get_cached_block(h, [0])
            if found is None:
                break
            hits.append(found[0])
        need_new = -(-len(req.tokens) // self.block_size) - len(hits)
        evictable = sum(1 for b in hits if b.ref_cnt == 0)  # hits sitting in the free queue
        if not self._room(need_new + evictable):
            self.stats.misses += 1
            return False
        self.pool.touch(hits)
        req.blocks = hits + self.pool.get_new_blocks(need_new)
        req.computed = len(hits) * self.block_size
        req.cached_blocks = len(hits)
        self.stats.hit_blocks += len(hits)
        self._verify(req, req.computed)  # a prefix hit carries KV another request wrote
        self._write(req, req.computed, len(req.tokens))
        req.computed = len(req.tokens)
        self._cache(req)
        return True

    def _preempt(self, req: Req) -> None:
        self.running.remove(req)
        self._free(req)  # its tokens are recomputed when it is admitted again
        self.waiting.insert(0, req)
        self.stats.preemptions += 1

    def step(self) -> None:
        self.stats.steps += 1
        for req in list(self.running):
            if req not in self.running:
                continue
            if len(req.tokens) > len(req.blocks) * self.block_size:  # the new token needs a block
                while not self._room(1):
                    self.stats.misses += 1
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim is req:
                        break
                if req not in self.running:
                    continue
                req.blocks += self.pool.get_new_blocks(1)
            self._write(req, req.computed, len(req.tokens))
            req.computed = len(req.tokens)
            self._cache(req)
        while self.waiting and len(self.running) < self.max_running:
            if not self._admit(self.waiting[0]):
                break
            self.running.append(self.waiting.pop(0))
            self.stats.admitted += 1
        for req in list(self.running):
            self._verify(req, req.computed)
            if len(req.tokens) - req.prompt_len >= req.max_tokens or len(req.tokens) >= self.max_len:
                self.running.remove(req)
                self._free(req)
                self.stats.finished += 1
            else:
                req.tokens.append(self.rng.randrange(1, 30000))
        if self.elastic is not None:
            self.elastic.on_step(active=bool(self.running or self.waiting))

    def drain(self) -> None:
        for req in list(self.running):
            self.running.remove(req)
            self._free(req)
        self.waiting.clear()
        if self.elastic is not None:
            self.elastic.on_step(active=False)


def make_pools(
    driver: Any,
    num_blocks: int,
    bytes_per_block: int,
    chunk: int,
    limit: Any,
    *,
    block_size: int = 16,
    grow_chunks: int = 1,
    give_back_interval: float = 0.0,
) -> tuple[Any, Any]:
    """(vLLM BlockPool made elastic, its ElasticKVBuffer) for ``num_blocks`` virtual blocks."""
    from vllm.v1.core.block_pool import BlockPool

    from kvpolicy.adapters.vllm_adapter.elastic.buffer import ElasticKVBuffer, pinned_chunks
    from kvpolicy.adapters.vllm_adapter.elastic.pool import ElasticPool

    buffer = ElasticKVBuffer(
        driver, num_blocks=num_blocks, bytes_per_block=bytes_per_block, chunk=chunk, limit=limit,
        pinned=pinned_chunks(bytes_per_block, chunk) * chunk, grow_chunks=grow_chunks,
    )
    pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=block_size)
    ElasticPool.adopt(pool, buffer, give_back_interval=give_back_interval, report_interval=0.0)
    return pool, buffer


def check(pool: Any, buffer: Any) -> None:
    """The invariants after a step: see ElasticPool.check_consistent, plus the mirror."""
    from kvpolicy.adapters.vllm_adapter.elastic.pool import elastic_of

    elastic = elastic_of(pool)
    elastic.flush()
    elastic.check_consistent()
    for block in pool.blocks[1:]:
        assert (block.ref_cnt > 0) == buffer.live.is_live(block.block_id), f"block {block.block_id}: the mirror differs"


def soak(driver: Any, device: str, *, steps: int, seed: int = 0, check_every: int = 1) -> dict[str, Any]:
    """The loop for ``steps`` steps under changing limits: grow to a limit, lower it below what is live
    (deferred, then applied), raise it, go idle (give back to the target); returns what happened.

    Geometry: Qwen3-8B in vLLM's BLHNC layout (36 layers × 8 KV heads × 128 × 2 × bf16 × 16 tokens =
    2.25 MiB per block, so blocks straddle 2 MiB chunks), 1 GiB of virtual capacity.
    """
    from kvpolicy.alloc import StaticLimit

    MiB = 1 << 20
    bpb = 36 * 8 * 128 * 2 * 2 * 16
    limit = StaticLimit(96 * MiB, 64 * MiB)
    pool, buffer = make_pools(driver, (1 << 30) // bpb, bpb, 2 * MiB, limit)
    held: list[int] = []
    acks: set[Any] = set()
    try:
        data = buffer.tensor()
        if device != "cpu":
            assert data.device.type == "cuda", f"the buffer is on {data.device}, expected the GPU"
        loop = PoolLoop(pool, data, bpb, 16, seed=seed)
        del data
        for step in range(steps):
            if step == steps * 2 // 5:
                limit.set(24 * MiB, 16 * MiB)
            elif step == steps * 3 // 5:
                limit.set(160 * MiB, 128 * MiB)
            if step < steps * 4 // 5:
                while len(loop.waiting) < 3:
                    loop.submit()
            loop.step()
            if step % check_every == 0:
                check(pool, buffer)
            kv = buffer.mapping
            acks.add(limit.acked)
            held.append(kv.held_bytes - buffer.pinned)
            if not kv.deferred:
                assert kv.held_bytes - buffer.pinned <= limit.read().limit, (step, kv.held_bytes, limit.read())
            assert limit.pending == 0 and limit.mapped == kv.held_bytes - buffer.pinned
        loop.drain()
        limit.set(160 * MiB, 0)
        loop.elastic.on_step(active=False)
        check(pool, buffer)
        return {
            "stats": loop.stats.__dict__,
            "acks": sorted(a for a in acks if a),
            "peak_phase1": max(held[: steps * 2 // 5]),
            "peak_phase3": max(held[steps * 3 // 5 : steps * 4 // 5]) if steps >= 5 else 0,
            "idle_held": buffer.mapping.held_bytes,
            "pinned": buffer.pinned,
            "refusals": dict(loop.elastic.refusals),
            "zero_calls": buffer.mapping.arenas[0].calls.zero,
        }
    finally:
        loop = None  # drop the views before the arena goes
        buffer.close()
