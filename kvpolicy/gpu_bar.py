"""A GPU's memory as one bar of marks, and its legend: one vocabulary for ``explain`` and ``top``.

From the left: headroom ``#``, other use ``=``, each runtime-owned pool by its own
mark, elastic memory in use ``u``, and the free elastic budget ``.``; what is left
of the capacity (the budget's rounding down to whole chunks) stays blank. A pool's
mark comes from its name, so it reads: a name with a number takes the number's
first digit (``c4`` → ``4``, ``c128`` → ``1``), any other its first letter in upper
case (``swa`` → ``S``, ``indexer`` → ``I``); a mark another pool of the bar already
has goes to the next letter or digit of the name.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvpolicy.terminal import PLAIN, Style, visible_width
from kvpolicy.units import format_bytes

HEADROOM, OTHER, USED, FREE = "#", "=", "u", "."
_FIXED_MARKS = frozenset({HEADROOM, OTHER, USED, FREE})


@dataclass(frozen=True)
class Segment:
    label: str
    size: int
    mark: str
    role: str | None
    """The style role (kvpolicy.terminal.ROLES); None for a pool, coloured by ``pool_index``."""
    pool_index: int = 0


def pool_marks(names: Iterable[str]) -> dict[str, str]:
    """A distinct one-character mark for each pool name, in sorted order of the names."""
    marks: dict[str, str] = {}
    taken = set(_FIXED_MARKS)
    for name in sorted(set(names)):
        mark = next((c for c in _candidates(name) if c not in taken), None)
        if mark is None:
            mark = next(c for c in string.ascii_uppercase + string.digits + string.punctuation if c not in taken)
        marks[name] = mark
        taken.add(mark)
    return marks


def _candidates(name: str) -> list[str]:
    chars = [c.upper() for c in name if c.isalnum() and c.isascii()]
    digits = [c for c in chars if c.isdigit()]
    first = digits[:1] if digits else chars[:1]
    return first + chars


def segments(*, headroom: int, other_used: int, pools: Mapping[str, int], used: int, free: int) -> list[Segment]:
    """The segments of a GPU's bar, left to right (pools by name)."""
    marks = pool_marks(pools)
    out = [Segment("headroom", headroom, HEADROOM, "headroom"), Segment("other use", other_used, OTHER, "other")]
    out += [Segment(name, pools[name], mark, None, i) for i, (name, mark) in enumerate(marks.items())]
    out += [Segment("elastic in use", used, USED, "used"), Segment("elastic free", max(0, free), FREE, "free")]
    return out


def render_bar(parts: list[Segment], capacity: int, width: int, style: Style = PLAIN) -> str:
    """``width`` cells: each segment in proportion to the capacity, at least one cell if it is not empty."""
    if capacity <= 0 or width <= 0:
        return " " * max(0, width)
    cells = _widths([max(0, p.size) for p in parts], capacity, width)
    out = []
    for part, n in zip(parts, cells):
        text = part.mark * n
        out.append(style.pool(text, part.pool_index) if part.role is None else style.paint(text, part.role))
    return "".join(out) + " " * (width - sum(cells))


def _widths(sizes: list[int], capacity: int, width: int) -> list[int]:
    """Cells per segment by cumulative rounding (so they add up), a cell for each non-empty one."""
    total = sum(sizes)
    scale = max(capacity, total)
    cells, start, acc = [], 0, 0
    for size in sizes:
        acc += size
        end = round(acc * width / scale)
        cells.append(end - start)
        start = end
    for i, size in enumerate(sizes):
        if size > 0 and cells[i] == 0:
            cells[i] = 1
    while sum(cells) > width:
        widest = max(range(len(cells)), key=lambda i: cells[i])
        cells[widest] -= 1
    return cells


def legend(parts: list[Segment], *, sizes: bool, style: Style = PLAIN, all_kinds: bool = False) -> list[str]:
    """One entry per segment, ``MARK label[ size]``: the non-empty ones (every kind with ``all_kinds``)."""
    entries = []
    for p in parts:
        if p.size <= 0 and not (all_kinds and p.role is not None):
            continue
        mark = style.pool(p.mark, p.pool_index) if p.role is None else style.paint(p.mark, p.role)
        entries.append(f"{mark} {p.label}" + (f" {format_bytes(p.size)}" if sizes else ""))
    return entries


def wrap(entries: list[str], width: int, indent: str, first: str = "", sep: str = "  ") -> list[str]:
    """Entries on as few lines of at most ``width`` visible characters as fit (an entry is never split)."""
    lines: list[str] = []
    line, used = first or indent, visible_width(first or indent)
    fresh = True
    for entry in entries:
        w = visible_width(entry)
        if not fresh and used + len(sep) + w > width:
            lines.append(line)
            line, used, fresh = indent, len(indent), True
        if not fresh:
            line, used = line + sep, used + len(sep)
        line, used, fresh = line + entry, used + w, False
    lines.append(line)
    return lines
