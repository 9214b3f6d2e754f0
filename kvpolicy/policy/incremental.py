"""Parse and build a policy statement by statement, reusing what the last version built.

An editor lints on every change, and a change touches one statement; parsing and
building the other hundreds again is most of the time of a lint. ``StatementCache``
cuts the text into chunks, each ending where a line ends with every brace and
parenthesis closed and holding one top-level statement (with the blank and comment
lines before it), and keeps what each chunk built under its text. A later version
builds only the chunks it does not find there, parsing runs of adjacent new chunks as
one text. A chunk found at another line (below a line added or removed) is moved
there: its spans and comments shifted by the lines it moved, which is what building
it there makes (it starts a line, so columns stay). Unless building it reported
something: a message may name a line (``the first is on line 12``), so such a chunk
is built again where it now stands.

Why a chunk parses alone as it does inside the whole text: a top-level statement
starts in the parser state after a separator (or at the start), and both states
accept the same terminals, so the contextual lexer reads the chunk's first token the
same way; from there LALR reaches the same states. The separators and comments
between statements are the only state the postlexer carries across a line that
closes every block, and the builder reads neither. ``tests/language/test_incremental.py``
checks the whole lint, field by field, against a lint from scratch over random edits.

A chunk that does not parse alone makes ``build`` answer None: syntax errors, their
recovery and their messages need the whole text, which the caller then parses.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from lark import Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.policy import model as m
from kvpolicy.policy.build import Built, PolicyBuilder, assemble, first_token
from kvpolicy.policy.lark_parser import NestingTooDeep, Token, Trace, parse

_OPENERS = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|[{}()]')
"""What a line's depth depends on: braces and parentheses, outside strings and comments
(the grammar's STRING and COMMENT: neither spans lines)."""


@dataclass(frozen=True)
class Chunk:
    first_line: int
    """1-based."""
    offset: int
    """Of its first character in the text."""
    text: str
    """Whole lines, each with its newline (the last chunk's last line may have none)."""


def split(text: str) -> list[Chunk]:
    """``text`` as chunks: each ends after a line with code that closes every brace and
    parenthesis opened since the chunk began (the text after the last such line is a
    chunk too)."""
    chunks: list[Chunk] = []
    depth = 0
    has_code = False
    start = start_line = 0
    position = 0
    lines = text.split("\n")
    for number, line in enumerate(lines):
        for match in _OPENERS.finditer(line):
            token = match.group()
            if token in "{(":
                depth += 1
            elif token in "})":
                depth -= 1
        stripped = line.strip()
        has_code = has_code or bool(stripped and not stripped.startswith("#"))
        position += len(line) + (number < len(lines) - 1)
        if has_code and depth <= 0 and number < len(lines) - 1:
            chunks.append(Chunk(start_line + 1, start, text[start:position]))
            start, start_line, depth, has_code = position, number + 1, 0, False
    if start < len(text) or not chunks:
        chunks.append(Chunk(start_line + 1, start, text[start:]))
    return chunks


@dataclass(frozen=True)
class ChunkBuilt:
    """What one chunk built: its statements, and its comments, as they stood when the chunk
    began at line ``first_line``, character ``offset`` of the text."""

    statements: tuple[Built, ...]
    comments: tuple[Token, ...]
    first_line: int
    offset: int

    @property
    def movable(self) -> bool:
        """Whether it can be moved to another line: building it reported nothing (a message
        may name a line, which moving would not change)."""
        return not any(s.diagnostics for s in self.statements)

    def at(self, chunk: Chunk) -> ChunkBuilt:
        """What ``chunk`` (of the same text, maybe at another line and offset) builds."""
        if (chunk.first_line, chunk.offset) == (self.first_line, self.offset):
            return self
        lines, chars = chunk.first_line - self.first_line, chunk.offset - self.offset
        statements = self.statements if not lines else tuple(_moved(s, lines) for s in self.statements)
        comments = tuple(
            Token(c.type, c.value, c.start_pos + chars, c.line + lines, c.column, c.end_line + lines, c.end_column, c.end_pos + chars)
            for c in self.comments
        )
        return ChunkBuilt(statements, comments, chunk.first_line, chunk.offset)


def _moved(built: Built, lines: int) -> Built:
    """A statement built ``lines`` lines further down (it reported nothing: see ``ChunkBuilt.movable``)."""
    return Built(
        None if built.node is None else built.node.moved(lines),
        None if built.version is None else built.version.moved(lines),
        None if built.version_span is None else built.version_span.moved(lines),
        built.diagnostics,
    )


@dataclass(frozen=True)
class BuiltText:
    """A whole text built from chunks: the policy, what building reported, and the comments."""

    policy: m.Policy
    diagnostics: list[Diagnostic]
    comments: list[Token]


class StatementCache:
    """What the last version of one document built, chunk by chunk (see the module's doc)."""

    def __init__(self) -> None:
        self._built: dict[tuple[str, str], ChunkBuilt] = {}

    def build(self, text: str, file: str, sha256: str, end: Span) -> BuiltText | None:
        """``text`` parsed and built as ``PolicyBuilder`` would build the whole; None when a
        chunk does not parse (the caller parses the whole text). Keeps only this version's chunks."""
        chunks = split(text)
        built = [self._reuse(file, c) for c in chunks]
        index = 0
        while index < len(chunks):
            if built[index] is not None:
                index += 1
                continue
            run_end = index
            while run_end < len(chunks) and built[run_end] is None:
                run_end += 1
            fresh = _build_run(chunks[index:run_end], file)
            if fresh is None:
                return None
            built[index:run_end] = fresh
            index = run_end
        done = [b for b in built if b is not None]
        self._built = {(file, c.text): b for c, b in zip(chunks, done)}
        policy, diagnostics = assemble(file, (s for b in done for s in b.statements), sha256, end)
        comments = [comment for b in done for comment in b.comments]
        return BuiltText(policy, diagnostics, comments)

    def _reuse(self, file: str, chunk: Chunk) -> ChunkBuilt | None:
        """What the last version built of this chunk's text, where this chunk stands; None
        when it must be built (a new text, or one that cannot move to its new line)."""
        found = self._built.get((file, chunk.text))
        if found is None or (found.first_line != chunk.first_line and not found.movable):
            return None
        return found.at(chunk)


def _build_run(chunks: list[Chunk], file: str) -> list[ChunkBuilt] | None:
    """Adjacent chunks parsed as one text and built, each chunk's part apart; None on a syntax error."""
    first = chunks[0]
    trace = Trace()
    try:
        tree = parse("".join(c.text for c in chunks), trace)
    except (UnexpectedToken, UnexpectedCharacters, NestingTooDeep):
        return None
    _move(tree, trace.comments, first.first_line - 1, first.offset)
    builder = PolicyBuilder(file)
    statements: list[list[Built]] = [[] for _ in chunks]
    comments: list[list[Token]] = [[] for _ in chunks]
    starts = [c.first_line for c in chunks]
    for child in tree.children:
        if isinstance(child, Tree):
            statements[bisect_right(starts, first_token(child).line) - 1].append(builder.statement(child))
    for comment in trace.comments:
        comments[bisect_right(starts, comment.line) - 1].append(comment)
    return [ChunkBuilt(tuple(s), tuple(c), chunk.first_line, chunk.offset) for s, c, chunk in zip(statements, comments, chunks)]


def _move(tree: Tree, comments: list[Token], lines: int, offset: int) -> None:
    """Shift the positions of a text parsed apart to where it stands in the whole (its
    first line starts a line of the whole, so columns stay)."""
    for token in (*tree.scan_values(lambda value: isinstance(value, Token)), *comments):
        token.line += lines
        token.end_line += lines
        token.start_pos += offset
        token.end_pos += offset
