"""A serving engine's scheduler over a ``BlockPool``: continuous batching, queueing, preemption.

One ``step(now)`` is one engine iteration:

1. requests that arrived join the waiting queue (FIFO); a client whose request waited
   longer than ``patience_s`` without starting leaves (``abandoned``);
2. decode: every running request whose next token starts a new block gets one
   (``alloc`` of all of them at once); when none can be had, the youngest running
   request is preempted — its blocks freed, itself put back at the head of the queue
   to be recomputed — until the allocation succeeds. Then every running request
   generates one token, attention runs over the batch, and finished requests have
   their KV checked against the pattern written into it and their blocks freed (with
   ``check_between_steps``, after the step: below);
3. admission: waiting requests, oldest first, get the blocks of their prompt (and of
   the tokens they had generated before a preemption) while the step's prefill token
   budget lasts; the first that cannot get its blocks stops admission (every request
   then waiting counts as ``queued``, once). Nothing is admitted in a step that
   preempted, nor beyond a limit lowered below the pool's use (a deferred shrink: the
   running requests finish and the memory goes back);
4. ``pool.sync()``: a new limit or target is applied, memory above the target that no
   live block holds goes back, usage is reported;
5. the step's tokens are out once the GPU work is done: each request's first token gives
   its time to first token, each later one a gap since the one before (``latency.py``:
   TTFT percentiles and SLO attainment).

With ``map_between_steps`` the step does no mapping for admission and no give-back: the
driver work runs after the step's tokens are out, in the time before the next step is
due (an engine's wait for its forward pass on the GPU). Admission takes only free blocks
of mapped chunks; when the queue's head needs more, the step stops admitting and notes
what the requests it would have admitted need, and after the step ``sync()`` runs (step
4, moved) and the pool grows by that much (``BlockPool.grow``; refused: the requests wait
for memory, as a refused ``alloc`` makes them), so they are admitted the next step. A
decode step's block still comes from ``alloc`` (the reserve, or one growth step).

The check of a finished request's KV is the benchmark's instrument, not engine work: an
engine frees a finished request's blocks without reading them. With ``check_between_steps``
it runs after the step's tokens are out, before the blocks are freed (so nothing can reuse
them unchecked), and its time is reported apart (``step_ms_p99_with_check``: the step and its
completions' check together, what the step took when the check ran inside it). Either way
the summary says where the slowest 1% of steps went (``tail``).

Accounting (checked by the CI test): every request that arrived is completed, abandoned,
running or waiting at the end. Tokens served are output tokens generated; a preempted
request keeps the tokens it generated (they are recomputed with its prompt, as engines
do), so no token is counted twice.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kvwork import KVWork, block_key
from latency import DEFAULT_GAP_S, DEFAULT_TTFT_S, attainment, meets_slo, percentile
from traces import Request

from kvpolicy.alloc.blocks import BlockPool
from kvpolicy.alloc.errors import DeviceOutOfMemory, OutOfBlocks


@dataclass(eq=False)
class Live:
    """A request inside the engine."""

    req: Request
    generated: int = 0
    blocks: np.ndarray | None = None
    n_blocks: int = 0
    started: bool = False
    waited: bool = False
    first_token: float | None = None
    """Trace time of the first output token (None: none yet)."""
    last_token: float = 0.0
    max_gap: float = 0.0
    """The longest wait between two consecutive output tokens (a preemption's recompute included)."""

    @property
    def context(self) -> int:
        return self.req.prompt + self.generated


@dataclass
class Counters:
    arrived: int = 0
    admitted: int = 0
    completed: int = 0
    abandoned: int = 0
    queued: int = 0
    """Requests that waited in the queue, at least once, while the pool could not give memory."""
    preempted: int = 0
    """Preemptions (a request preempted twice counts twice)."""
    tokens: int = 0
    corrupted: int = 0
    """Requests whose KV did not read back as written."""
    checked: int = 0
    completed_output: int = 0
    """Output tokens of the completed requests."""
    oom: int = 0
    """Physical out-of-memory: DeviceOutOfMemory from the driver or a CUDA OOM from torch."""
    refusals: dict[str, int] = field(default_factory=dict)
    """Allocation refusals by reason (limit, admission, capacity, device)."""
    topped_up: int = 0
    """Chunk groups the pool mapped ahead of demand between steps (``top_up``), off the step's time."""
    grown_between: int = 0
    """Chunk groups mapped between steps for requests the step could not admit from free blocks."""
    ttft: list[float] = field(default_factory=list)
    """Seconds from arrival to the first token, per request that got one."""
    slo_met: int = 0
    slo_missed: int = 0
    """Completed requests that met / missed the SLO, plus every abandoned one (a miss)."""


PHASES = ("alloc", "write", "attend", "check", "free", "sync", "gpu_wait", "grow", "top_up")
"""Where a step's wall time goes: the pool's allocations (elastic mapping included), the GPU work
(the KV pattern writes, attention, the completion checks; launches only, unless profiling), freeing,
``pool.sync()`` (limits, give-back unmapping; between steps with ``map_between_steps``), the wait for
the GPU at the step's end, and after the step, not in its time: the growth for the requests it could
not admit (``map_between_steps``) and the pool's ``top_up()``, mapping ahead of demand."""

STEP_PHASES = ("alloc", "write", "attend", "check", "free", "sync", "gpu_wait")
"""The phases a step's own time can hold (``check`` and ``sync`` only where they run inside it)."""


class Engine:
    def __init__(
        self,
        pool: BlockPool,
        work: KVWork,
        requests: list[Request],
        *,
        block_tokens: int,
        max_request_blocks: int,
        prefill_tokens_per_step: int,
        max_running: int,
        patience_s: float | None,
        is_oom: Callable[[BaseException], bool] = lambda exc: False,
        profile: bool = False,
        token_clock: Callable[[], float] | None = None,
        slo_ttft_s: float = DEFAULT_TTFT_S,
        slo_gap_s: float = DEFAULT_GAP_S,
        map_between_steps: bool = False,
        check_between_steps: bool = False,
        kv_bytes_bound: int | None = None,
        driver_chunks_between_steps: int | None = None,
    ) -> None:
        """``driver_chunks_between_steps`` (with ``map_between_steps``): the chunk groups the growth for
        admission may map between two steps, less what the pool's ``sync()`` gave back there (its own
        bound is the pool's ``give_back_chunks_per_sync``); None: no bound.

        ``kv_bytes_bound``: the summary's ``step_ms_p99_within_bound`` is the p99 over the steps
        whose running requests held at most this many KV bytes (e.g. a static tenant's share: the
        steps a static tenant could have run, so a larger batch's GPU work is compared with none)."""
        self.pool = pool
        self.work = work
        self.requests = requests
        self.bt = block_tokens
        self.max_request_blocks = max_request_blocks
        self.prefill_budget = prefill_tokens_per_step
        self.max_running = max_running
        self.patience = patience_s
        self.is_oom = is_oom
        self.waiting: deque[Live] = deque()
        self.running: list[Live] = []
        self.next_arrival = 0
        self.c = Counters()
        self.step_seconds: list[float] = []
        self.last_stats = None
        """What the pool's ``sync()`` said at the end of the last step."""
        self.profile = profile
        """Wait for the GPU after each phase of GPU work, so its time is the phase's (slower: a diagnosis)."""
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.step_ops: list[int] = []
        """Per step, the chunk groups its ``alloc``/``free``/``sync`` mapped or unmapped (driver work inside the step)."""
        self.token_clock = token_clock
        """Trace time when a step's tokens are out (after its GPU work); None: the step's ``now``."""
        self.slo_ttft_s, self.slo_gap_s = slo_ttft_s, slo_gap_s
        self.map_between_steps = map_between_steps
        self.driver_chunks_between_steps = driver_chunks_between_steps
        self.check_between_steps = check_between_steps
        self.kv_bytes_bound = kv_bytes_bound
        self.step_kv_blocks: list[int] = []
        """Per step, the KV blocks its running requests held when it attended."""
        self.step_phases: list[tuple[float, ...]] = []
        """Per step, the seconds of each of ``STEP_PHASES`` inside it."""
        self.step_checks: list[tuple[int, float]] = []
        """Per step, the requests it finished and the seconds their KV check took (inside it or after it)."""
        self.intervals: list[float] = []
        """Wall seconds from each step's start to the next one's: what a running request waits per token."""
        self._last_start: float | None = None
        self._wanted: tuple[int, int] = (0, 0)
        """Blocks the step could not admit from free ones: the queue's head's, and all it would have admitted."""
        self._emitted: list[Live] = []
        self._finished: list[Live] = []
        self._to_retire: list[Live] = []
        """Finished requests whose KV is checked and blocks freed after the step (``check_between_steps``)."""

    # -- one iteration ----------------------------------------------------------------------
    def step(self, now: float) -> None:
        """One engine iteration at ``now`` seconds into the run (see the module docstring)."""
        started = time.perf_counter()
        if self._last_start is not None:
            self.intervals.append(started - self._last_start)
        self._last_start = started
        ops = self.driver_ops()
        before = [self.phase_seconds[p] for p in STEP_PHASES]
        self._arrivals(now)
        preempted = self._decode()
        if not preempted:
            self._admit()
        if not self.map_between_steps:
            self._sync()
        with self._phase("gpu_wait"):
            self.work.synchronize()
        self.step_seconds.append(time.perf_counter() - started)
        self.step_phases.append(tuple(self.phase_seconds[p] - b for p, b in zip(STEP_PHASES, before)))
        self.step_ops.append(self.driver_ops() - ops)
        self._tokens_out(now if self.token_clock is None else self.token_clock())
        # Between steps: the finished requests' check, then the next step takes its blocks from mapped memory.
        if self._to_retire:
            self._retire(self._to_retire)
            self._to_retire = []
        if self.map_between_steps:
            ops = self.driver_ops()
            self._sync()
            bound = self.driver_chunks_between_steps
            self._grow_for_admission(None if bound is None else bound - (self.driver_ops() - ops))
        with self._phase("top_up"):
            self.c.topped_up += len(self.pool.top_up())

    def _sync(self) -> None:
        with self._phase("sync"):
            self.last_stats = self.pool.sync()

    def _grow_for_admission(self, chunks: int | None) -> None:
        """Map what the requests the step could not admit need, and the next decode's blocks: all it
        would have admitted, or if that is refused the queue's head alone. Refused: they wait for memory.

        ``chunks``: map at most about this many chunk groups now (None: all that is missing); the
        rest at the next intervals, as the step that still cannot admit them asks again."""
        (head, all_of_them), self._wanted = self._wanted, (0, 0)
        if not head or (chunks is not None and chunks <= 0):
            return
        most = None if chunks is None else max(1, chunks * self.pool.group_bytes // self.pool.block_bytes)
        decode = sum(1 for r in self.running if r.context % self.bt == 0)
        shorts = [wanted + decode - self.pool.free_blocks for wanted in (all_of_them, head)]  # the larger first
        if most is not None:
            shorts = [min(short, most) for short in shorts]
        before = self.pool.mapping.groups_mapped
        with self._phase("grow"):
            for short in dict.fromkeys(shorts):  # once each
                if short <= 0:
                    break
                try:
                    self._pool_call(self.pool.grow, short)
                    break
                except OutOfBlocks:
                    continue
            else:
                self._blocked()
        self.c.grown_between += self.pool.mapping.groups_mapped - before

    @contextmanager
    def _phase(self, name: str, gpu: bool = False) -> Iterator[None]:
        """Add the block's wall time to ``phase_seconds[name]`` (with ``profile``, its GPU work's too)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if gpu and self.profile:
                self.work.synchronize()
            self.phase_seconds[name] += time.perf_counter() - started

    def driver_ops(self) -> int:
        """Chunk groups the pool has mapped and unmapped so far."""
        m = self.pool.mapping
        return m.groups_mapped + m.groups_unmapped

    def _arrivals(self, now: float) -> None:
        reqs = self.requests
        while self.next_arrival < len(reqs) and reqs[self.next_arrival].arrival <= now:
            self.waiting.append(Live(reqs[self.next_arrival]))
            self.next_arrival += 1
            self.c.arrived += 1
        if self.patience is not None and self.waiting:
            deadline = now - self.patience
            if any(not r.started and r.req.arrival < deadline for r in self.waiting):
                kept = deque(r for r in self.waiting if r.started or r.req.arrival >= deadline)
                self.c.abandoned += len(self.waiting) - len(kept)
                self.c.slo_missed += len(self.waiting) - len(kept)
                self.waiting = kept

    def _tokens_out(self, t: float) -> None:
        """The step's tokens are out at trace time ``t``: first tokens and gaps; finished requests against the SLO."""
        for r in self._emitted:
            if r.first_token is None:
                r.first_token = t
                self.c.ttft.append(t - r.req.arrival)
            elif t - r.last_token > r.max_gap:
                r.max_gap = t - r.last_token
            r.last_token = t
        self._emitted = []
        for r in self._finished:
            assert r.first_token is not None
            if meets_slo(r.first_token - r.req.arrival, r.max_gap, ttft_s=self.slo_ttft_s, gap_s=self.slo_gap_s):
                self.c.slo_met += 1
            else:
                self.c.slo_missed += 1
        self._finished = []

    def _decode(self) -> bool:
        """Append blocks, generate a token per running request, attend, finish; True if it preempted."""
        bt = self.bt
        writes_b: list[int] = []
        writes_k: list[int] = []
        need = [r for r in self.running if r.context % bt == 0]
        preempted = False
        while need:
            try:
                with self._phase("alloc"):
                    ids = self._alloc(len(need))
            except OutOfBlocks:
                victim = self.running.pop()  # the youngest: the least work lost
                self._preempt(victim)
                preempted = True
                if victim in need:
                    need.remove(victim)
                continue
            for r, b in zip(need, ids):
                self._append(r, b, writes_b, writes_k)
            break
        # The new blocks are written before anything reads them (attention, the check of a
        # request that finishes in this very step) and before they can be freed and reused.
        with self._phase("write", gpu=True):
            self._guard(self.work.write, writes_b, writes_k)
        if not self.running:
            self.step_kv_blocks.append(0)
            self.step_checks.append((0, 0.0))
            return preempted
        for r in self.running:
            r.generated += 1
        self.c.tokens += len(self.running)
        self._emitted = list(self.running)
        self.step_kv_blocks.append(sum(r.n_blocks for r in self.running))
        with self._phase("attend", gpu=True):
            self._guard(self.work.attend, [r.blocks[: r.n_blocks] for r in self.running], [r.context for r in self.running])
        done = [r for r in self.running if r.generated >= r.req.output]
        self.step_checks.append((len(done), 0.0))
        if done:
            self.running = [r for r in self.running if r.generated < r.req.output]
            self.c.completed += len(done)
            self.c.completed_output += sum(r.req.output for r in done)
            self._finished = done
            if self.check_between_steps:
                self._to_retire = done
            else:
                self._retire(done)
        return preempted

    def _retire(self, done: list[Live]) -> None:
        """Check the finished requests' KV, then free their blocks (the check reads them first)."""
        before = self.phase_seconds["check"]
        with self._phase("check", gpu=True):
            self.check(done)
        self.step_checks[-1] = (len(done), self.phase_seconds["check"] - before)
        with self._phase("free"):
            for r in done:
                self.pool.free(r.blocks[: r.n_blocks].tolist())
                r.blocks = None

    def _admit(self) -> None:
        budget = self.prefill_budget
        writes_b: list[int] = []
        writes_k: list[int] = []
        # New requests take memory only within the pool's admission room: under a deferred shrink the
        # free blocks of the held chunks go back, and under contention a pool above its target drains.
        room = self.pool.admission_room()
        why = "deferred" if self.pool.deferred else "target"
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting[0]
            tokens = r.context
            if self._waits_for_its_own_step(tokens, budget):
                break
            n = -(-tokens // self.bt)
            if room is not None and n * self.pool.block_bytes > room:
                self._refused(why)
                self._blocked()
                break
            if self.map_between_steps and n > self.pool.free_blocks:
                more = self._admissible_blocks(budget)
                if room is not None:  # what the room leaves is all the next step could admit
                    more = max(n, min(more, room // self.pool.block_bytes))
                self._wanted = (n, more)
                break
            try:
                with self._phase("alloc"):
                    ids = self._alloc(n)
            except OutOfBlocks:
                self._blocked()
                break
            if room is not None:
                room -= n * self.pool.block_bytes
            self.waiting.popleft()
            if r.blocks is None:
                r.blocks = np.empty(self.max_request_blocks, dtype=np.int64)
            r.n_blocks = 0
            for b in ids:
                self._append(r, b, writes_b, writes_k)
            if not r.started:
                r.started = True
                self.c.admitted += 1
            self.running.append(r)
            budget -= tokens
        with self._phase("write", gpu=True):
            self._guard(self.work.write, writes_b, writes_k)

    def _waits_for_its_own_step(self, tokens: int, budget: int) -> bool:
        """A prompt longer than the prefill budget left waits for a step of its own (it may take a whole one)."""
        return tokens > budget and budget < self.prefill_budget

    def _admissible_blocks(self, budget: int) -> int:
        """Blocks of the waiting requests that admission would take now, oldest first, within the
        prefill ``budget`` left and the running limit (the rules of ``_admit``, without memory)."""
        blocks, room = 0, self.max_running - len(self.running)
        for r in self.waiting:
            tokens = r.context
            if room <= 0 or self._waits_for_its_own_step(tokens, budget):
                break
            blocks += -(-tokens // self.bt)
            budget -= tokens
            room -= 1
        return blocks

    def _blocked(self) -> None:
        """Admission stopped for lack of memory: every request waiting now waits for memory."""
        for r in self.waiting:
            if not r.waited:
                r.waited = True
                self.c.queued += 1

    # -- helpers ----------------------------------------------------------------------------
    def _alloc(self, n: int) -> list[int]:
        return self._pool_call(self.pool.alloc, n)

    def _pool_call(self, fn: Callable[[int], list[int]], n: int) -> list[int]:
        """``fn(n)`` (the pool's ``alloc`` or ``grow``); a refusal is counted by reason, a physical OOM as one."""
        try:
            return fn(n)
        except OutOfBlocks as exc:
            self._refused(exc.reason)
            if exc.reason == "device" or isinstance(exc.__cause__, DeviceOutOfMemory):
                self.c.oom += 1
                print(f"out of memory while growing the pool: {exc}", file=sys.stderr, flush=True)
            raise

    def _refused(self, reason: str) -> None:
        self.c.refusals[reason] = self.c.refusals.get(reason, 0) + 1

    def _append(self, r: Live, block: int, writes_b: list[int], writes_k: list[int]) -> None:
        assert r.n_blocks < self.max_request_blocks, f"request {r.req.key} outgrew its block table"
        r.blocks[r.n_blocks] = block
        writes_b.append(block)
        writes_k.append(block_key(r.req.key, r.n_blocks))
        r.n_blocks += 1

    def _preempt(self, r: Live) -> None:
        self.pool.free(r.blocks[: r.n_blocks].tolist())
        r.n_blocks = 0
        self.waiting.appendleft(r)
        self.c.preempted += 1

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run GPU work; a CUDA out-of-memory is counted (the goal is none), anything else propagates."""
        try:
            return fn(*args)
        except Exception as exc:
            if self.is_oom(exc):
                self.c.oom += 1
                print(f"out of memory in the step's GPU work: {exc}", file=sys.stderr, flush=True)
                return None
            raise

    def check(self, reqs: list[Live]) -> None:
        """Read the requests' blocks back and count those whose KV is not what was written."""
        blocks: list[int] = []
        keys: list[int] = []
        ends: list[int] = []
        for r in reqs:
            ids = r.blocks[: r.n_blocks].tolist()
            blocks += ids
            keys += [block_key(r.req.key, i) for i in range(len(ids))]
            ends.append(len(blocks))
        bad = self._guard(self.work.check, blocks, keys)
        if bad is None:
            return
        start = 0
        for end in ends:
            if any(bad[start:end]):
                self.c.corrupted += 1
            start = end
        self.c.checked += len(reqs)

    def finish(self) -> None:
        """At the end of the run: check the KV of every request still running."""
        if self.running:
            self.check(self.running)

    # -- reporting --------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        c = self.c
        steps = sorted(self.step_seconds)
        p99 = _pct(steps, 0.99)
        ops = sorted(self.step_ops)
        intervals = sorted(self.intervals)
        bound = None
        if self.kv_bytes_bound is not None:
            most = self.kv_bytes_bound // self.pool.block_bytes
            bound = sorted(s for s, k in zip(self.step_seconds, self.step_kv_blocks) if k <= most)
        return {
            "arrived": c.arrived,
            "admitted": c.admitted,
            "completed": c.completed,
            "abandoned": c.abandoned,
            "running_at_end": len(self.running),
            "waiting_at_end": len(self.waiting),
            "never_arrived": len(self.requests) - self.next_arrival,
            "queued": c.queued,
            "preempted": c.preempted,
            "tokens": c.tokens,
            "corrupted": c.corrupted,
            "checked": c.checked,
            "oom": c.oom,
            "refusals": dict(sorted(c.refusals.items())),
            "steps": len(steps),
            "step_ms_p50": _pct(steps, 0.50) * 1000,
            "step_ms_p99": p99 * 1000,
            "step_ms_max": (steps[-1] if steps else 0.0) * 1000,
            "step_ms_p99_within_bound": None if bound is None else _pct(bound, 0.99) * 1000,
            "steps_within_bound": None if bound is None else len(bound),
            "kv_bytes_bound": self.kv_bytes_bound,
            "interval_ms_p50": _pct(intervals, 0.50) * 1000,
            "interval_ms_p99": _pct(intervals, 0.99) * 1000,
            "map_between_steps": self.map_between_steps,
            "check_between_steps": self.check_between_steps,
            "step_ms_p99_with_check": self._p99_with_check(p99) * 1000,
            "tail": self._tail(p99),
            "groups_topped_up": c.topped_up,
            "groups_grown_between": c.grown_between,
            "step_driver_ops_p50": _pct(ops, 0.50),
            "step_driver_ops_p99": _pct(ops, 0.99),
            "step_driver_ops_max": ops[-1] if ops else 0,
            "ttft_ms_p50": _ms(percentile(c.ttft, 0.50)),
            "ttft_ms_p99": _ms(percentile(c.ttft, 0.99)),
            "ttft_s": [round(v, 4) for v in c.ttft],
            "slo": {"ttft_s": self.slo_ttft_s, "gap_s": self.slo_gap_s, "met": c.slo_met, "missed": c.slo_missed,
                    "attainment": attainment(c.slo_met, c.slo_missed)},
            "phase_seconds": {k: round(v, 3) for k, v in self.phase_seconds.items()},
            "profiled": self.profile,
        }

    def _p99_with_check(self, p99: float) -> float:
        """The step p99 with each step's completion check counted in it, wherever the check ran
        (``p99``: the step p99, which already counts a check run inside the step)."""
        if not self.check_between_steps:
            return p99
        return _pct(sorted(s + c for s, (_, c) in zip(self.step_seconds, self.step_checks)), 0.99)

    def _tail(self, threshold: float) -> dict[str, Any] | None:
        """Where the slowest 1% of steps (at or above ``threshold``, the p99) went: their mean time in
        each phase inside the step, the KV blocks they attended, and how many requests they finished."""
        if not self.step_seconds:
            return None
        slow = [i for i, s in enumerate(self.step_seconds) if s >= threshold]
        n = len(slow)

        def mean(values: Iterator[float]) -> float:
            return sum(values) / n

        return {
            "steps": n,
            "step_ms": mean(self.step_seconds[i] for i in slow) * 1000,
            "phase_ms": {p: round(mean(self.step_phases[i][j] for i in slow) * 1000, 3) for j, p in enumerate(STEP_PHASES)},
            "kv_blocks": mean(self.step_kv_blocks[i] for i in slow),
            "finished": mean(self.step_checks[i][0] for i in slow),
            "with_finished": sum(1 for i in slow if self.step_checks[i][0]) / n,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _pct(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


__all__ = ["Counters", "Engine", "Live"]
