"""A forgiving outline of a policy text: tokens, statements and blocks, for the cursor.

Hover and completion run on text that is being typed, where the parser sees
errors. This scanner never fails: it splits the text into tokens, statements
(ended by a newline outside parentheses, or ``;``) and brace blocks, and knows
which block and statement every token is in. What the words *mean* stays the
parser's business; here a block's kind is the keyword that opened it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvpolicy.lsp.language import BLOCK_FIELDS as LANGUAGE_BLOCK_FIELDS

BLOCK_FIELDS: dict[str, tuple[str, ...]] = {key or "top": fields for key, fields in LANGUAGE_BLOCK_FIELDS.items()}
"""The statements each kind of block takes (the parser's table; the top level is ``top``)."""

_CHILD_BLOCKS = {"top": ("defaults", "gpu", "model", "rule"), "model": ("pool",)}
"""Which statements open a block of their own kind, in each kind of block."""

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_TOKEN = re.compile(
    r"(?P<COMMENT>#[^\n]*)"
    r'|(?P<STRING>"(?:[^"\\\n]|\\.)*"?)'
    rf"|(?P<QUANTITY>{_NUMBER}(?:[ \t]*%|[A-Za-z_][A-Za-z0-9_]*)?)"
    r"|(?P<ATTRIBUTE>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+\.?)"
    r"|(?P<NAME>[A-Za-z_][A-Za-z0-9_]*\.?)"
    r"|(?P<COMPARE><=|>=|==|!=|<|>)"
    r"|(?P<NEWLINE>\n)"
    r"|(?P<PUNCT>[{}(),;*])"
    r"|(?P<SPACE>[ \t\f\r]+)"
    r"|(?P<OTHER>.)"
)
_UNIT_AFTER_SPACE = re.compile(r"[ \t]+([A-Za-z_][A-Za-z0-9_]*)(?![A-Za-z0-9_.])")
_KEYWORDS = frozenset(word for fields in BLOCK_FIELDS.values() for word in fields) | {"and", "or", "not", "to"}


@dataclass(eq=False)
class Token:
    kind: str
    text: str
    line: int
    """0-based line."""
    col: int
    """0-based column, in characters."""
    offset: int
    statement: Statement | None = field(default=None, repr=False)

    @property
    def end_col(self) -> int:
        return self.col + len(self.text)

    @property
    def end(self) -> int:
        return self.offset + len(self.text)


@dataclass(eq=False)
class Statement:
    block: Block = field(repr=False)
    tokens: list[Token] = field(default_factory=list)

    @property
    def head(self) -> Token | None:
        return self.tokens[0] if self.tokens else None

    @property
    def keyword(self) -> str | None:
        """The word that starts the statement, if it is a word."""
        head = self.head
        return head.text if head is not None and head.kind == "NAME" else None


@dataclass(eq=False)
class Block:
    kind: str
    """``top``, ``defaults``, ``gpu``, ``model``, ``pool``, ``rule``, or ``unknown``."""
    opener: Statement | None = field(default=None, repr=False)
    """The statement whose ``{`` opened the block (None: the top level)."""
    parent: Block | None = field(default=None, repr=False)
    start: int = 0
    """Offset just after the ``{``."""
    end: int | None = None
    """Offset of the ``}``; None while the block is not closed."""
    statements: list[Statement] = field(default_factory=list)
    children: list[Block] = field(default_factory=list, repr=False)

    def setting(self, keyword: str) -> Statement | None:
        """The first statement of this block that starts with ``keyword``."""
        return next((s for s in self.statements if s.keyword == keyword), None)

    def keywords(self) -> set[str]:
        return {s.keyword for s in self.statements if s.keyword}

    @property
    def name(self) -> Token | None:
        """The name or pattern after the block's keyword (``model "x"``, ``pool c4``)."""
        if self.opener is None or len(self.opener.tokens) < 2:
            return None
        token = self.opener.tokens[1]
        return token if token.kind in ("STRING", "NAME") else None

    def contains(self, offset: int) -> bool:
        return self.start <= offset and (self.end is None or offset <= self.end)


@dataclass(eq=False)
class Outline:
    text: str
    tokens: list[Token]
    top: Block
    line_starts: list[int]
    _end_offsets: list[int] | None = field(default=None, repr=False)

    def offset(self, line: int, col: int) -> int:
        """The offset of 0-based ``line``/``col`` (clamped to the text)."""
        if line >= len(self.line_starts):
            return len(self.text)
        start = self.line_starts[line]
        end = self.line_starts[line + 1] - 1 if line + 1 < len(self.line_starts) else len(self.text)
        return min(start + col, end)

    def position(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return line, offset - self.line_starts[line]

    def token_at(self, offset: int) -> Token | None:
        """The token under ``offset`` (or ending at it), spaces and newlines excluded."""
        index = bisect.bisect_right(self._ends, offset)
        for token in self.tokens[max(0, index - 1) : index + 1]:
            if token.offset <= offset <= token.end and token.kind not in ("SEP", "NL"):
                return token
        return None

    def block_at(self, offset: int) -> Block:
        """The innermost block whose braces contain ``offset``."""
        block = self.top
        while True:
            inner = next((c for c in block.children if c.contains(offset)), None)
            if inner is None:
                return block
            block = inner

    def tokens_before(self, offset: int) -> list[Token]:
        """The tokens of the statement being written at ``offset``, up to it."""
        index = bisect.bisect_right(self._ends, offset)
        out: list[Token] = []
        for token in reversed(self.tokens[:index]):
            if token.kind in ("COMMENT", "NL"):
                continue
            if token.kind == "SEP" or token.text in ("{", "}"):
                break
            out.append(token)
        return out[::-1]

    @property
    def _ends(self) -> list[int]:
        if self._end_offsets is None:
            self._end_offsets = [t.end for t in self.tokens]
        return self._end_offsets

    def models(self) -> list[Block]:
        return [b for b in self.top.children if b.kind == "model"]


def scan(text: str) -> Outline:
    """The outline of ``text``; never fails."""
    tokens: list[Token] = []
    top = Block("top")
    block = top
    statement = Statement(top)
    parens = 0
    line_starts = [0]
    for token in _lex(text):
        tokens.append(token)
        if token.kind == "NEWLINE":
            line_starts.append(token.end)
            token.kind = "NL" if parens else "SEP"  # a newline inside parentheses ends nothing
            if not parens:
                statement = Statement(block)
            continue
        value = token.text
        if token.kind == "COMMENT":
            continue
        if value == ";":
            token.kind = "SEP"
            statement = Statement(block)
            continue
        if value == "{":
            block = _open_block(block, statement, token)
            statement, parens = Statement(block), 0
            continue
        if value == "}":
            if block.parent is not None:
                block.end = token.offset
                block = block.parent
            statement, parens = Statement(block), 0
            continue
        if value == "(":
            parens += 1
        elif value == ")":
            parens = max(0, parens - 1)
        statement.tokens.append(token)
        token.statement = statement
        if len(statement.tokens) == 1:
            block.statements.append(statement)
    return Outline(text, tokens, top, line_starts)


def _lex(text: str) -> Iterator[Token]:
    """Every token of ``text`` but runs of spaces, with its position; never fails."""
    line, line_start, pos = 0, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None  # OTHER matches any character
        kind = m.lastgroup or "OTHER"
        value = m.group()
        if kind == "QUANTITY" and (value[-1].isdigit() or value[-1] == "."):
            unit = _UNIT_AFTER_SPACE.match(text, m.end())
            if unit and unit.group(1) not in _KEYWORDS:
                value = text[pos : unit.end()]  # `4 GiB` is one quantity
        if kind != "SPACE":
            yield Token(kind, value, line, pos - line_start, pos)
        pos += len(value)
        if kind == "NEWLINE":
            line, line_start = line + 1, pos


def _open_block(block: Block, opener: Statement, brace: Token) -> Block:
    """The block that ``brace``, ending the statement ``opener`` of ``block``, opens."""
    opener.tokens.append(brace)
    brace.statement = opener
    child = Block(_block_kind(block.kind, opener.keyword), opener, block, start=brace.end)
    block.children.append(child)
    if len(opener.tokens) == 1:  # a '{' that starts its own statement
        block.statements.append(opener)
    return child


def _block_kind(parent: str, keyword: str | None) -> str:
    if keyword is not None and keyword in _CHILD_BLOCKS.get(parent, ()):
        return keyword
    return "unknown"
