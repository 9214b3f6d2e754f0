"""Reading a segment's records without its lock, decoded into the ledger's values.

The controller, ``kvpolicy status`` and the engines read here; none of them takes the
write lock or blocks a writer. Records are read through their sequence words
(``records``) and turned into values by ``codec``. The same reads serve writers under
the lock, where nothing moves meanwhile.
"""

from __future__ import annotations

from typing import Any

from kvpolicy.runtime import codec
from kvpolicy.runtime.errors import CorruptSegment
from kvpolicy.runtime.records import SegmentRecords
from kvpolicy.runtime.segment import Segment
from kvpolicy.runtime.values import GpuFigures, SlotView, Totals


class SegmentReader:
    """The records of one open segment, read lock-free and decoded."""

    __slots__ = ("_figures", "_figures_of", "gpu", "records", "seg", "where")

    def __init__(self, segment: Segment) -> None:
        self.seg = segment
        self.gpu = segment.gpu
        self.where = f"kvpolicy ledger: {segment.path}"
        self.records = SegmentRecords(segment.slot_count, self.where)
        self._figures_of: Any = None  # the GPU record's values ``_figures`` was decoded from
        self._figures: GpuFigures | None = None

    def figures(self) -> GpuFigures:
        _, g = self.records.gpu.read(self.seg.mm, self.seg.words)
        if g is not self._figures_of:  # the record cache hands back the same tuple until the record moves
            self._figures, self._figures_of = codec.decode_figures(g, self.where), g
        figures = self._figures
        assert figures is not None  # decoded on the first read (a record's values are never None)
        return figures

    def totals(self) -> Totals:
        _, t = self.records.totals.read(self.seg.mm, self.seg.words)
        return codec.decode_totals(t)

    def slot(self, index: int) -> SlotView | None:
        """The instance in slot ``index`` (None if free), read consistently; CorruptSegment if invalid."""
        records = self.records.slots[index]
        values = records.read(self.seg.mm, self.seg.words)
        return None if values is None else codec.decode_slot(index, self.gpu, values, records.where)

    def slots(self) -> tuple[list[SlotView], list[str]]:
        """Every attached instance, and a message per slot that failed its checks."""
        views: list[SlotView] = []
        problems: list[str] = []
        for i in range(self.seg.slot_count):
            try:
                v = self.slot(i)
            except CorruptSegment as exc:
                problems.append(str(exc))
                continue
            if v is not None:
                views.append(v)
        return views, problems
