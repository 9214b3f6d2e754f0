"""A rank's side of an elastic KV cache whose scheduler is in another process (tensor parallel > 1).

The rank's ``ElasticKVBuffer`` is built as in one process (its ledger instance on its own
GPU, the null block's chunks pinned), but nothing in the rank decides what to map: the
engine core names the chunks (``wire.RankRequest``) and ``RankMapper.handle`` carries
them out on this rank alone:

- ``map``: admit the chunks' bytes in this rank's ledger instance (its limit and its
  GPU's elastic budget), map them in every layer region, zero them, commit — all or
  nothing on this rank (``ChunkMapping.map``). A refusal leaves the rank as it was.
- ``unmap``: synchronise the device (kernels in flight may still read them), unmap, and
  release them in the ledger. Chunks the rank does not hold are skipped, so a rollback
  may name chunks some ranks never mapped.
- ``sync``: only the piggybacked report, acknowledgement and activity.

Every answer carries the rank's mapped chunks and limits, so the core sees at once if a
rank disagrees with its books. The rank's own mapping never applies a limit revision by
itself (it knows no live blocks): shrinking is always the core's ``unmap``.
"""

from __future__ import annotations

from typing import Any

from kvpolicy.alloc import DriverError, OutOfBlocks

from .buffer import ElasticKVBuffer
from .wire import Outcome, RankAnswer, RankGeometry, RankLimits, RankRequest


_REFUSED: dict[str, Outcome] = {"limit": "limit", "admission": "admission", "device": "device", "capacity": "capacity"}
"""The refusals a rank reports as such (``OutOfBlocks.reason``); anything else is an ``error``."""


class RankMapper:
    """Carries out the core's requests on one rank's buffer."""

    def __init__(self, buffer: ElasticKVBuffer, *, rank: int, gpu: str, block_stride: int) -> None:
        self.buffer = buffer
        self.rank = rank
        self.gpu = gpu
        self.block_stride = block_stride
        self.used = 0
        self.waiting = 0
        buffer.limit.used_bytes = lambda: self.used  # the scheduler's count, sent by the core
        buffer.bound = True  # driven by the core's scheduler, from another process
        self._touch = getattr(buffer.limit.inner, "touch", None)

    def handle(self, request: RankRequest) -> RankAnswer:
        mapping, limit = self.buffer.mapping, self.buffer.limit
        if request.active and self._touch is not None:
            self._touch()
        if request.ack is not None:
            limit.acknowledge(limit.inner.read().revision, request.ack)
        outcome: Outcome = "ok"
        detail = ""
        changed = request.used is not None and (request.used, request.waiting) != (self.used, self.waiting)
        if request.used is not None:  # the core's report: its books' use, and the growth they refused
            self.used, self.waiting = request.used, request.waiting
        try:
            if request.op == "map":
                mapping.read()
                mapping.map(sorted(set(request.chunks)), requested=0, free=0)
                changed = True
            elif request.op == "unmap":
                self.unmap(request.chunks)
                changed = True
        except OutOfBlocks as exc:
            outcome, detail = _REFUSED.get(exc.reason, "error"), str(exc)
        except DriverError as exc:
            outcome, detail = "error", str(exc)
        # What waits for memory is the core's figure: its books saw every refusal, a rank's included.
        mapping.new_period()
        mapping.note_refused(self.waiting)
        if changed:
            mapping.report()
        return self.answer(outcome, detail, describe=request.op == "describe")

    def unmap(self, chunks: Any) -> None:
        """Unmap ``chunks`` that this rank holds (after the device is synchronised), releasing them in the ledger."""
        mapping = self.buffer.mapping
        going = sorted({c for c in chunks if mapping.is_mapped(c)})
        if going:
            mapping.release_down_to(mapping.held_bytes - len(going) * mapping.group_bytes, going)

    def answer(self, outcome: Outcome, detail: str = "", describe: bool = False) -> RankAnswer:
        buffer, limit = self.buffer, self.buffer.limit
        reading = limit.inner.read()
        mapping = buffer.mapping
        geometry = None
        if describe:
            geometry = RankGeometry(
                num_blocks=buffer.num_blocks, bytes_per_block=buffer.bytes_per_block, chunk=buffer.chunk,
                pinned=buffer.pinned, grow_chunks=buffer.grow_chunks, regions=buffer.regions,
                block_stride=self.block_stride,
            )
        return RankAnswer(
            rank=self.rank,
            gpu=self.gpu,
            outcome=outcome,
            detail=detail,
            mapped=tuple(c for c in range(mapping.num_chunks) if mapping.is_mapped(c)),
            limits=RankLimits(
                limit=reading.limit, target=reading.target, guarantee=reading.guarantee,
                revision=reading.revision, pressure=limit.pressure(),
            ),
            geometry=geometry,
        )
