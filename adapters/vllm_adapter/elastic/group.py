"""The engine core's side of an elastic KV cache over several ranks (tensor parallel > 1).

vLLM's scheduler (and so the elastic ``ElasticPool`` beside its ``BlockPool``) is in the
engine core; each rank's KV tensors, ledger instance and driver are in the rank's own
process (``rank.RankMapper``). The core keeps **books**: an ``ElasticKVBuffer`` of the
ranks' shape over a driver that maps nothing (``books.BookDriver``), whose
``ChunkMapping`` is a ``GroupMapping``. Everything vLLM's pool does runs on the books as in
one process; where the books map or unmap chunks, every rank is asked first, in one
blocking collective call (``Collective``):

- **Grow, all or nothing.** The books check the group's limit, then every rank admits
  the chunks in its own GPU's ledger instance, maps and zeroes them (``map``). Only when
  every rank answers ``ok`` do the books map them, so the scheduler can hand out a block
  only when it is mapped on every rank. If one rank refuses, every rank that mapped
  unmaps them again at once (``unmap``, in the same growth), and the growth is an
  ordinary allocation miss (``OutOfBlocks`` with the refusing rank's reason).
- **Shrink.** The pool takes the chunks' blocks out of circulation, then every rank
  synchronises its device, unmaps them and releases them in its ledger; then the books.
- **Limits** (``RankGroupLimit``): the group's limit, target and guarantee are the
  smallest of the ranks' (the controller gives the ranks of one engine the same limit,
  the smallest among them); they come with every answer, and at most every
  ``refresh_interval`` seconds a ``sync`` call asks for them (carrying the scheduler's
  used bytes, the acknowledgement of the limits and the activity to the ranks).
- **A rank that dies** (the call raises): the group is broken; the engine stops
  growing (``RanksLost``, then refusals with reason ``ranks``) and makes no more calls:
  chunks the books give back from then on only leave the scheduler's circulation. The dead rank's ledger slot, with what it had mapped, is
  freed by the ledger's reclaim; the survivors' mapped bytes stay counted until each
  detaches or dies.

The ranks take calls in order, so a ``map`` always precedes the ``execute_model`` that
uses its blocks (vLLM's workers run one RPC queue).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.alloc import ChunkMapping, DriverError, LimitReading, OutOfBlocks
from kvpolicy.alloc.limits import AckStatus

from .books import BookDriver
from .buffer import ElasticKVBuffer
from .wire import Op, RankAnswer, RankRequest

Collective = Callable[[RankRequest], Sequence[RankAnswer]]
"""One blocking call of every rank with the same request; their answers, in rank order."""

logger = logging.getLogger(__name__)

REFUSALS = ("limit", "admission", "device", "capacity")


class RanksLost(DriverError):
    """A collective call to the ranks failed (a rank died or stopped answering): the group is broken."""

    def __init__(self, detail: str) -> None:
        super().__init__("collective_rpc", "CUDA_ERROR_ILLEGAL_STATE", detail=detail)


class RankGroupLimit:
    """``LimitSource`` of the core's books: the smallest of the ranks' limits; the calls to the ranks.

    Its own admission only keeps the books under that limit; the real admission is each
    rank's, in its own GPU's ledger (``GroupMapping.map``).
    """

    def __init__(
        self,
        collective: Collective,
        size: int,
        *,
        refresh_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._collective = collective
        self.size = size
        self.refresh_interval = refresh_interval
        self._clock = clock
        self._last_sync = clock()
        self.broken: str | None = None
        """Why the group is broken (a rank lost), or None."""
        self.answers: tuple[RankAnswer, ...] = ()
        """The ranks' last answers."""
        self._reading = LimitReading(0, 0, 0, 0)
        self._pressure = 0
        self.mapped = 0
        self.pending = 0
        self._used: int | None = None
        self._waiting = 0
        self._ack: AckStatus | None = None
        self._active = False
        self.calls = 0
        """Collective calls made (every growth and shrink is one, a refused growth two)."""

    # -- the ranks -------------------------------------------------------------------------
    def call(self, op: Op, chunks: Iterable[int] = ()) -> tuple[RankAnswer, ...]:
        """One collective call; ``RanksLost`` (and the group broken) if it fails or the answers do not add up."""
        if self.broken is not None:
            raise RanksLost(f"the engine's ranks were lost earlier ({self.broken}); it grows no more")
        request = RankRequest(op=op, chunks=tuple(chunks), used=self._used, waiting=self._waiting, ack=self._ack,
                              active=self._active)
        self._used, self._waiting, self._ack, self._active = None, 0, None, False
        self.calls += 1
        try:
            answers = tuple(RankAnswer.model_validate(a) for a in self._collective(request))
        except Exception as exc:  # the collective's own error: a dead peer, a closed pipe, a timeout
            self.broken = f"{type(exc).__name__}: {exc}"
            logger.error("kvpolicy: the elastic KV cache lost its ranks (%s); the engine grows no more", self.broken)
            raise RanksLost(f"{op} on the ranks failed: {self.broken}") from exc
        if sorted(a.rank for a in answers) != list(range(self.size)):
            self.broken = f"{len(answers)} answers from ranks {[a.rank for a in answers]}, expected {self.size}"
            raise RanksLost(self.broken)
        self.take(answers)
        self._last_sync = self._clock()
        return answers

    def take(self, answers: Sequence[RankAnswer]) -> None:
        """The ranks' limits from their answers: the group's is the smallest of each."""
        self.answers = tuple(answers)
        limits = [a.limits for a in answers if a.limits is not None]
        if len(limits) != len(answers):
            return
        reading = LimitReading(
            limit=min(x.limit for x in limits),
            target=min(x.target for x in limits),
            revision=sum(x.revision for x in limits),
            guarantee=min(x.guarantee for x in limits),
        )
        if reading != self._reading:
            self._reading = reading
        self._pressure = sum(x.pressure for x in limits)

    def touch(self) -> None:
        """The scheduler had requests: the ranks touch their activity at the next call."""
        self._active = True

    # -- LimitSource -----------------------------------------------------------------------
    def read(self) -> LimitReading:
        if self.broken is None and self._clock() - self._last_sync >= self.refresh_interval:
            try:
                self.call("sync")
            except RanksLost:
                pass  # broken now: the reading stays, growth is refused from here on
        return self._reading

    def certain_refusal(self, nbytes: int) -> bool:
        return False  # admit is a comparison with the books: nothing to save

    def admit(self, nbytes: int) -> bool:
        if self.mapped + self.pending + nbytes > self._reading.limit:
            return False
        self.pending += nbytes
        return True

    def commit(self, nbytes: int) -> None:
        assert self.pending >= nbytes, "commit without a matching admit"
        self.pending -= nbytes
        self.mapped += nbytes

    def rollback(self, nbytes: int) -> None:
        assert self.pending >= nbytes, "rollback without a matching admit"
        self.pending -= nbytes

    def release(self, nbytes: int) -> None:
        assert self.mapped >= nbytes, "released more than was mapped"
        self.mapped -= nbytes

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        self._used, self._waiting = used, waiting

    def acknowledge(self, revision: int, status: AckStatus) -> None:
        self._ack = status

    def pressure(self) -> int:
        return self._pressure


class GroupMapping(ChunkMapping):
    """The core's books of the ranks' mappings: a chunk is mapped here only once it is mapped on every rank."""

    def __init__(self, driver: Any, grid: Any, *, ranks: RankGroupLimit, **options: Any) -> None:
        self.ranks = ranks
        before = options.pop("before_unmap", None)

        def before_unmap(chunks: list[int]) -> None:
            if before is not None:
                before(chunks)  # the scheduler's pool takes their blocks out of circulation first
            self._unmap_on_ranks(chunks)

        super().__init__(driver, grid, before_unmap=before_unmap, **options)

    def map(self, indices: list[int], *, requested: int, free: int) -> None:
        new = [i for i in indices if not self.is_mapped(i)]
        if not new:
            return
        held, creating = self.held_bytes, len(new) * self.group_bytes
        if held + creating > self.reading.limit:
            self.note_refused(creating)
            raise OutOfBlocks(requested, free, "limit", held=held, limit=self.reading.limit, needed=creating,
                              hint="free blocks, or raise the limit")
        if self.ranks.broken is not None:
            raise OutOfBlocks(requested, free, "ranks", held=held, limit=self.reading.limit, needed=creating,
                              hint=f"a rank of the engine was lost ({self.ranks.broken}): it grows no more")
        answers = self.ranks.call("map", new)
        refused = [a for a in answers if a.outcome != "ok"]
        if refused:
            self._roll_back(new)
            first = refused[0]
            reason = first.outcome if first.outcome in REFUSALS else "error"
            if reason in ("limit", "admission"):
                self.note_refused(creating)
            error = OutOfBlocks(requested, free, reason, held=held, limit=self.reading.limit, needed=creating,
                                hint=f"rank {first.rank} on {first.gpu} refused: {first.detail}")
            if reason == "error":
                raise DriverError("rank map", "CUDA_ERROR_UNKNOWN", detail=str(error)) from error
            raise error
        for a in answers:
            if not set(new) <= set(a.mapped):
                self._roll_back(new)
                raise DriverError("rank map", "CUDA_ERROR_ILLEGAL_STATE",
                                  detail=f"rank {a.rank} answered ok but does not hold chunks {new}")
        try:
            super().map(new, requested=requested, free=free)
        except BaseException:
            self._roll_back(new)
            raise

    def _roll_back(self, chunks: list[int]) -> None:
        """Every rank that mapped ``chunks`` in a growth that failed unmaps them again."""
        try:
            self.ranks.call("unmap", chunks)
        except RanksLost:
            pass  # broken: the survivors' chunks stay counted until each detaches or dies

    def _unmap_on_ranks(self, chunks: list[int]) -> None:
        if self.ranks.broken is not None:
            return  # no more calls: the survivors keep these chunks, counted in their ledgers, until each goes
        answers = self.ranks.call("unmap", chunks)  # RanksLost: nothing is unmapped in the books
        bad = [a for a in answers if a.outcome != "ok" or set(chunks) & set(a.mapped)]
        if bad:
            raise DriverError("rank unmap", "CUDA_ERROR_UNKNOWN",
                              detail=f"rank {bad[0].rank} on {bad[0].gpu} kept chunks {chunks}: {bad[0].detail}")


def group_buffer(
    collective: Collective,
    size: int,
    *,
    name: str = "vllm-kv-ranks",
    refresh_interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    give_back_chunks: int | None = None,
) -> ElasticKVBuffer:
    """The core's books over the ranks' buffers (asked for their geometry once); ``AdapterError`` if they differ.
    ``give_back_chunks``: the bound on one give-back, which the core decides (``ElasticKVBuffer``)."""
    ranks = RankGroupLimit(collective, size, refresh_interval=refresh_interval, clock=clock)
    try:
        answers = ranks.call("describe")
    except RanksLost as exc:
        raise AdapterError(f"kvpolicy: the elastic KV cache's ranks did not answer: {exc}") from exc
    absent = [a.rank for a in answers if a.outcome != "ok" or a.geometry is None]
    if absent:
        raise AdapterError(f"kvpolicy: rank(s) {absent} of the engine have no elastic KV buffer; every rank must")
    shapes = {a.geometry for a in answers}
    if len(shapes) != 1:
        raise AdapterError(f"kvpolicy: the ranks' elastic KV buffers differ in shape ({sorted(map(str, shapes))})")
    (g,) = shapes
    assert g is not None
    buffer = ElasticKVBuffer(
        BookDriver(g.chunk, g.num_blocks * g.bytes_per_block + g.pinned + g.chunk * g.regions),
        num_blocks=g.num_blocks,
        bytes_per_block=g.bytes_per_block,
        chunk=g.chunk,
        limit=ranks,
        pinned=g.pinned,
        grow_chunks=g.grow_chunks,
        name=name,
        regions=g.regions,
        block_stride=g.block_stride,
        mapping=functools.partial(GroupMapping, ranks=ranks),
        give_back_chunks=give_back_chunks,
    )
    return buffer


def ranks_of(buffer: ElasticKVBuffer) -> RankGroupLimit | None:
    """The ranks behind the core's books ``buffer`` (None for a buffer of one process)."""
    mapping = buffer.mapping
    return mapping.ranks if isinstance(mapping, GroupMapping) else None
