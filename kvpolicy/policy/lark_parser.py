"""The grammar's Lark parser, and the postlexer between its lexer and its parser.

The grammar (``grammar/kvpolicy.lark``) is the single source of truth for the
tokens. Lark's contextual lexer reads a word as a keyword only where the parser
accepts that keyword (so ``order priority asc`` reads ``priority`` as a name);
the grammar is written so that this is exact (``tests/language/test_contextual_lexing.py``
checks it over the parser's states). ``Layout``, the postlexer, sees every token
before the parser does: it drops newlines inside parentheses, passes a run of
separators on as one, refuses nesting deeper than ``MAX_NESTING``, and records
what the error messages need (the tokens the parser took, the blocks and
parentheses open, the comments) in the ``Trace`` of the parse.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, cast

import lark
from lark import Lark, Tree
from lark.lark import PostLex

from kvpolicy.policy.vocabulary import TOP_LEVEL

MAX_NESTING = 32
TOP_LEVEL_BLOCKS = frozenset(TOP_LEVEL) - {"version"}
"""Statements that open a block only at the top level."""

if TYPE_CHECKING:

    class Token(lark.Token):
        """A token of a policy, as the type checker sees it: Lark types a token's positions
        as optional (a token made by hand may have none), but every token this parser hands
        on comes from its lexer, which sets them all (``new_borrow_pos`` copies them). The
        casts below, where tokens leave Lark, are the only place that claims it."""

        start_pos: int
        line: int
        column: int
        end_line: int
        end_column: int
        end_pos: int

else:
    Token = lark.Token


@cache
def grammar_text() -> str:
    return files("kvpolicy.grammar").joinpath("kvpolicy.lark").read_text(encoding="utf-8")


@dataclass
class Trace:
    """What one parse saw, for the error messages (the Lark parser is shared; each
    parse has its own trace)."""

    comments: list[Token] = field(default_factory=list)
    history: list[Token] = field(default_factory=list)
    """Every token the parser took, in order."""
    open_braces: list[tuple[Token, Token | None]] = field(default_factory=list)
    """(the '{', the first token of the statement it opens), innermost last."""
    open_parens: list[Token] = field(default_factory=list)
    blocks: list[tuple[Token, Token | None]] = field(default_factory=list)
    """Every block opened so far: (its '{', the first token of its statement)."""
    closed_by: dict[int, Token] = field(default_factory=dict)
    """The '}' that closed each block, by the offset of its '{'."""
    recovered_lines: frozenset[int] = frozenset()
    """Lines replaced by recovery: their tokens' columns are not the user's."""
    nested_heads: list[tuple[Token, tuple[tuple[Token, Token | None], ...]]] = field(default_factory=list)
    """A top-level statement (``model``, ``rule``...) that opened a block inside
    another block, with the blocks open around it: a sign of a forgotten '}'."""

    def took(self, token: Token, statement_head: Token) -> bool:
        """Record a token the parser took; whether it ended its statement (a brace)."""
        self.history.append(token)
        value = token.value
        if value == "(":
            self.open_parens.append(token)
        elif value == ")" and self.open_parens:
            self.open_parens.pop()
        elif value == "{":
            if self.open_braces and statement_head.value in TOP_LEVEL_BLOCKS:
                self.nested_heads.append((statement_head, tuple(self.open_braces)))
            self.open_braces.append((token, statement_head))
            self.blocks.append((token, statement_head))
            return True
        elif value == "}":
            if self.open_braces:
                self.closed_by[self.open_braces.pop()[0].start_pos] = token
            return True
        return False


_TRACE: ContextVar[Trace] = ContextVar("kvpolicy_parse_trace")


class NestingTooDeep(Exception):
    def __init__(self, token: Token, what: str) -> None:
        super().__init__(what)
        self.token = token
        self.what = what


def _check_nesting(token: Token, nots: int, parens: int, braces: int) -> None:
    """Refuse the token that would nest parentheses, conditions or blocks too deep, before
    the parser's recursion does."""
    value = token.value
    if nots + parens + (value == "(") > MAX_NESTING:
        what = "parentheses" if value == "(" else "conditions"
        raise NestingTooDeep(token, f"{what} nested more than {MAX_NESTING} deep")
    if value == "{" and braces >= MAX_NESTING:
        raise NestingTooDeep(token, f"blocks nested more than {MAX_NESTING} deep")


class Layout(PostLex):
    """The postlexer: statements, separators and nesting, between Lark's lexer and its parser.

    It records a token in the trace once the parser has taken it (when the parser asks
    for the next one), so an error message sees the blocks and parentheses open before
    the token it is about, whichever of the lexer or the parser refused that token.
    """

    always_accept = ("NAME", "ATTRIBUTE", "_SEP")
    """Terminals every parser state's lexer knows, so that a word is lexed whole
    (``tox`` is a name, never the keyword ``to`` and a name ``x``), an attribute is
    lexed as one wherever it stands, and a newline inside parentheses reaches this
    postlexer, which drops it."""

    def process(self, stream: Iterator[lark.Token]) -> Iterator[Token]:
        trace = _TRACE.get()
        history, parens, braces = trace.history, trace.open_parens, trace.open_braces
        statement_head: Token | None = None
        nots = 0  # 'not's in a row: each nests the condition one level deeper
        after_sep = False
        for token in cast("Iterator[Token]", stream):  # the lexer's tokens (see Token)
            if token.type == "_SEP":
                if parens and token.value != ";":
                    continue  # newlines inside parentheses do not end a statement
                statement_head = None
                # The grammar takes one separator where a statement ends: a run of them
                # (blank lines, comment lines, ';' at a line's end) is passed on as one.
                if not after_sep:
                    after_sep = True
                    yield token
                    history.append(token)
                continue
            after_sep = False
            value = token.value
            if statement_head is None:
                statement_head = token
            if token.type == "NOT":
                nots += 1
            elif value != "(":
                nots = 0
            _check_nesting(token, nots, len(parens), len(braces))
            yield token
            if trace.took(token, statement_head):  # the parser took it
                statement_head = None


def _keep_comment(token: lark.Token) -> lark.Token:
    _TRACE.get().comments.append(cast(Token, token))  # a lexer's token (see Token)
    return token


def _end_on_its_line(separator: lark.Token) -> lark.Token:
    """A newline ends on its own line, one column on (Lark ends it at the start of the
    next line): a diagnostic at the end of a line stays on that line."""
    token = cast(Token, separator)  # a lexer's token (see Token)
    token.end_line, token.end_column = token.line, token.column + 1
    return token


@cache
def parser() -> Lark:
    """The policy parser, built once per process (from Lark's cache of the analysed
    grammar where it can: a tenth of the time of the analysis)."""
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        postlex=Layout(),
        lexer_callbacks={"COMMENT": _keep_comment, "_SEP": _end_on_its_line},
        keep_all_tokens=True,  # spans and fmt read keywords, braces and separators
        maybe_placeholders=False,
        cache=_cache_file(),
    )


def _cache_file() -> str | bool:
    """Where Lark keeps the analysed grammar between runs (it checks that the file is
    of this grammar, these options and this Lark): a directory of this user's own.
    Lark's default, the shared temporary directory, would let another user plant the
    pickle it loads. False (no cache) where no such directory can be made."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "kvpolicy")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return False
    python = "".join(map(str, sys.version_info[:2]))
    return os.path.join(directory, f"grammar-lark{lark.__version__}-py{python}.pickle")


def parse(text: str, trace: Trace) -> Tree[Token]:
    """The parse tree of ``text``, recording what the parse saw in ``trace``; raises
    Lark's UnexpectedToken or UnexpectedCharacters, or NestingTooDeep."""
    reset = _TRACE.set(trace)
    try:
        return cast("Tree[Token]", parser().parse(text))  # the lexer's tokens (see Token)
    finally:
        _TRACE.reset(reset)
