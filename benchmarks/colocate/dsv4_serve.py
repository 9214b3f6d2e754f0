"""The DeepSeek-V4 tenant serving its trace through SGLang's own SWA allocator, on an elastic SWA pool.

Used by ``dsv4.py`` when the policy marks the V4 model's ``pool swa { owner elastic }``:
the pool was built through the adapter's real hooks (an ``ElasticSWA`` bound to SGLang's
``SWATokenToKVPoolAllocator``, under the engine's ledger session). Each scheduler round,
as SGLang's scheduler does:

1. the capacity check (``available_size``): the elastic pool ticks — a new limit at
   once, a give-back to its target, a report to the ledger;
2. requests that have arrived are admitted in order (``alloc_extend`` of the prompt),
   up to ``prefill_tokens_per_step`` and ``max_running_requests``; a refused one
   (``None``: the pool is full, or its limit refuses to map more) waits for the next
   round — counted, never an error;
3. one decode step for every running request (``alloc_decode``); a refused one
   retracts the newest request (freed, back to the front of the queue, its tokens
   recomputed when it is admitted again, as SGLang retracts) and tries again;
4. the SWA pages that left the sliding window go back (``free_swa``), and a request
   that produced its output tokens is freed (``free_swa`` + ``free_full``).

No model runs: the KV bytes are not written (the allocator tests check the data);
this is about what the pool maps while a scheduler allocates and frees. Arrivals
follow ``[dsv4] trace`` (``traces.requests_for``, the tenants' format) on the run's
clock kind; with the ``steps`` clock every round gives back and reports (no wall
clock in the pool either), so a run is the same on any machine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from params import Params
from traces import requests_for

SAMPLE_EVERY_STEPS = 50
"""A timeline row at least this often (and whenever the bytes mapped change)."""


@dataclass
class Running:
    key: int
    prompt: int
    output: int
    full: list[int] = field(default_factory=list)
    """Full-pool token indices, in order."""
    swa_freed_to: int = 0
    """Tokens below this position have had their SWA pages freed (out of the window)."""
    decoded: int = 0


@dataclass
class Stats:
    tokens: int = 0
    """Decode tokens produced, each once (a retracted request recomputes its own in its next prefill)."""
    done: int = 0
    admitted: int = 0
    extend_refusals: int = 0
    decode_refusals: int = 0
    retracted: int = 0
    over_limit_rounds: int = 0
    """Rounds that ended with the elastic bytes above the limit in force (a lowered limit not deferred)."""
    peak_elastic: int = 0
    peak_held: int = 0
    peak_limit: int = 0
    rows: list[list[int | float]] = field(default_factory=list)


class V4Server:
    """One V4 engine's scheduler loop over SGLang's allocator ``outer`` and its elastic SWA pool ``swa``."""

    COLUMNS = ("step", "t", "held", "elastic", "used", "limit", "running", "waiting")

    def __init__(self, params: Params, outer: Any, swa: Any, window: int, device: str) -> None:
        import torch

        d = params.dsv4
        assert d.trace is not None, "the V4 tenant serves only with a [dsv4.trace]"
        self.torch, self.device = torch, device
        self.outer, self.swa = outer, swa
        self.page, self.window = d.page_size, window
        self.step_s = d.step_ms / 1000
        self.wall = params.engine.clock == "wall"
        self.max_running, self.prefill = d.max_running_requests, d.prefill_tokens_per_step
        self.idle_steps = d.idle_steps
        self.pending = deque(requests_for(d.trace, len(params.tenants)))
        self.arrived = len(self.pending)
        self.waiting: deque[Running] = deque()
        self.running: list[Running] = []
        self.stats = Stats()
        self.steps = 0
        if not self.wall:
            swa.give_back_interval = swa.report_interval = 0.0  # every round: no wall clock in the pool

    # -- tensors as SGLang's scheduler passes them -------------------------------------------------------
    def _cpu(self, *values: int) -> Any:
        return self.torch.tensor(values, dtype=self.torch.int64)

    def _dev(self, *values: int) -> Any:
        return self.torch.tensor(values, dtype=self.torch.int64, device=self.device)

    # -- one round ------------------------------------------------------------------------------------
    def round(self, now: float) -> None:
        self.outer.available_size()  # the scheduler's capacity check: the pool ticks
        while self.pending and self.pending[0].arrival <= now:
            r = self.pending.popleft()
            self.waiting.append(Running(r.key, r.prompt, r.output))
        self._admit()
        self._decode()
        self.steps += 1
        self._sample(now)

    def _admit(self) -> None:
        budget = self.prefill
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            r = self.waiting[0]
            length = r.prompt + r.decoded  # a retracted request recomputes what it had
            out = self.outer.alloc_extend(self._dev(0), self._cpu(0), self._dev(length), self._cpu(length),
                                          self._dev(-1), length)
            if out is None:
                self.stats.extend_refusals += 1
                return  # the next round tries again
            self.waiting.popleft()
            r.full, r.swa_freed_to = out.cpu().tolist(), 0
            self._trim(r)
            self.running.append(r)
            self.stats.admitted += 1
            budget -= length

    def _decode(self) -> None:
        while self.running:
            seq = [len(r.full) + 1 for r in self.running]
            out = self.outer.alloc_decode(self._dev(*seq), self._cpu(*seq), self._dev(*(r.full[-1] for r in self.running)))
            if out is not None:
                break
            self.stats.decode_refusals += 1
            r = self.running.pop()  # SGLang retracts the newest request
            self._free(r)
            self.waiting.appendleft(r)
            self.stats.retracted += 1
        else:
            return
        still = []
        for r, loc in zip(self.running, out.cpu().tolist(), strict=True):
            r.full.append(loc)
            r.decoded += 1
            self.stats.tokens += 1
            if r.decoded >= r.output:
                self._free(r)
                self.stats.done += 1
            else:
                self._trim(r)
                still.append(r)
        self.running = still

    def _trim(self, r: Running) -> None:
        """Free the SWA pages wholly below the sliding window, as SGLang's scheduler does."""
        upto = max(0, len(r.full) - self.window - self.page) // self.page * self.page
        if upto > r.swa_freed_to:
            self.outer.free_swa(self._dev(*r.full[r.swa_freed_to:upto]))
            r.swa_freed_to = upto

    def _free(self, r: Running) -> None:
        if len(r.full) > r.swa_freed_to:
            self.outer.free_swa(self._dev(*r.full[r.swa_freed_to:]))
        self.outer.free_full(self._dev(*r.full))
        r.full, r.swa_freed_to = [], 0

    # -- what it measured -------------------------------------------------------------------------------
    def allowed(self) -> int:
        """The elastic bytes the pool may hold now: the ledger's limit, capped by the policy's max."""
        return int(self.swa.mapping.limit.read().limit) - int(self.swa.pinned)

    def _sample(self, now: float) -> None:
        s, swa = self.stats, self.swa
        elastic, held, limit = swa.elastic_bytes, swa.held_bytes, self.allowed()
        if elastic > limit and not swa.mapping.deferred:
            s.over_limit_rounds += 1
        s.peak_elastic, s.peak_held, s.peak_limit = max(s.peak_elastic, elastic), max(s.peak_held, held), max(s.peak_limit, limit)
        row = [self.steps, round(now, 4), held, elastic, swa.used_bytes, limit, len(self.running), len(self.waiting)]
        if not s.rows or s.rows[-1][2] != held or self.steps % SAMPLE_EVERY_STEPS == 0:
            s.rows.append(row)

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def serve(self, t0: float, stop: Callable[[], bool]) -> dict[str, Any]:
        """Serve the trace from wall-clock time ``t0``, then ``idle_steps`` idle rounds; ``stop()`` ends it early.

        Rounds are paced at most one per ``step_ms``; on the ``steps`` clock trace time is the
        rounds served, on the ``wall`` clock the time since ``t0``."""
        origin = time.monotonic() + (t0 - time.time())
        idle_left = self.idle_steps
        started = time.perf_counter()
        while (self.busy or idle_left > 0) and not stop():
            wait = origin + self.steps * self.step_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            now = time.monotonic() - origin if self.wall else self.steps * self.step_s
            if not self.busy:
                idle_left -= 1
            self.round(max(0.0, now))
        idle = self.swa.elastic_bytes
        return self.summary(idle, time.perf_counter() - started)

    def summary(self, idle_elastic: int, seconds: float) -> dict[str, Any]:
        s, m = self.stats, self.swa.mapping
        limit = m.limit  # PinnedFirst: the ledger's limit plus the pinned chunks, capped by the policy's max
        return {
            "arrived": self.arrived,
            "requests_done": s.done, "tokens_served": s.tokens, "admitted": s.admitted,
            "unfinished": len(self.pending) + len(self.waiting) + len(self.running),
            "refusals": {"extend": s.extend_refusals, "decode": s.decode_refusals, "pool": self.swa.refusals},
            "retracted": s.retracted, "steps": self.steps, "seconds": round(seconds, 3),
            "swa": {
                "pinned": self.swa.pinned, "peak_held": s.peak_held, "peak_elastic": s.peak_elastic,
                "idle_elastic": idle_elastic, "peak_limit": s.peak_limit, "policy_max": limit.cap,
                "group_bytes": m.group_bytes, "chunks_mapped": m.groups_mapped * self.swa.layers,
                "chunks_unmapped": m.groups_unmapped * self.swa.layers, "groups_mapped": m.groups_mapped,
                "groups_unmapped": m.groups_unmapped, "over_limit_rounds": s.over_limit_rounds,
                "pages": self.swa.pages, "layers": self.swa.layers, "page_bytes": self.swa.page_bytes,
            },
            "timeline": {"columns": list(self.COLUMNS), "rows": s.rows},
        }
