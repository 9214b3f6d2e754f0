"""Positions: the server counts characters (code points), the client counts its encoding's units.

kvpolicy's spans are 1-based line and column in characters; LSP positions are
0-based and count UTF-16 code units unless the client and server agreed on
UTF-8 or UTF-32. Everything inside the server is 0-based characters; the
conversion happens once, at the edge (``server.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lsprotocol import types

from kvpolicy.diagnostics import Span


@dataclass(frozen=True, order=True)
class Pos:
    line: int
    col: int
    """0-based, in characters."""


@dataclass(frozen=True)
class Region:
    start: Pos
    end: Pos

    @classmethod
    def of_span(cls, span: Span) -> Region:
        """A kvpolicy span (1-based, end exclusive) as a 0-based region."""
        return cls(Pos(span.line - 1, span.col - 1), Pos(span.end_line - 1, span.end_col - 1))

    @classmethod
    def on_line(cls, line: int, col: int, end_col: int) -> Region:
        return cls(Pos(line, col), Pos(line, end_col))

    def contains(self, pos: Pos) -> bool:
        return self.start <= pos <= self.end


class Codec:
    """Converts between characters and the client's position units for one text."""

    def __init__(self, text: str, encoding: str) -> None:
        self.encoding = str(encoding or types.PositionEncodingKind.Utf16)
        self.identity = self.encoding == types.PositionEncodingKind.Utf32 or text.isascii()
        self.lines = text.split("\n")

    def _units(self, chars: str) -> int:
        if self.encoding == types.PositionEncodingKind.Utf8:
            return len(chars.encode("utf-8"))
        return len(chars.encode("utf-16-le")) // 2

    def _line(self, line: int) -> str:
        return self.lines[line].removesuffix("\r") if 0 <= line < len(self.lines) else ""

    def to_client(self, pos: Pos) -> types.Position:
        if self.identity:
            return types.Position(line=pos.line, character=pos.col)
        return types.Position(line=pos.line, character=self._units(self._line(pos.line)[: pos.col]))

    def range(self, region: Region) -> types.Range:
        return types.Range(start=self.to_client(region.start), end=self.to_client(region.end))

    def from_client(self, position: types.Position) -> Pos:
        if self.identity:
            return Pos(position.line, position.character)
        text, units, col = self._line(position.line), 0, 0
        while col < len(text) and units < position.character:
            units += self._units(text[col])
            col += 1
        return Pos(position.line, col)

    def region(self, rng: types.Range) -> Region:
        return Region(self.from_client(rng.start), self.from_client(rng.end))
