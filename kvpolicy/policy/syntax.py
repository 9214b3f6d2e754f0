"""Text → Lark parse tree, with syntax errors people can act on.

The grammar (``grammar/kvpolicy.lark``) is the single source of truth for the
tokens: ``PolicyLexer`` compiles its terminals into one regular expression and,
like Lark's contextual lexer, turns a word into a keyword only where the parser
accepts that keyword (so ``order priority asc`` reads ``priority`` as a name).
One regex instead of a lexer per parser state is what makes a 10,000-line policy
lint in well under a second.

On a syntax error the offending line is replaced (keeping its braces balanced) and
the text parsed again, so one run reports several errors.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files

from lark import Lark, Token, Tree
from lark.common import LexerConf
from lark.exceptions import UnexpectedToken
from lark.lexer import Lexer
from lark.parsers.lalr_analysis import Shift

from kvpolicy.diagnostics import Diagnostic
from kvpolicy.policy.vocabulary import TOP_LEVEL

MAX_ERRORS = 20
MAX_NESTING = 32
TOP_LEVEL_BLOCKS = frozenset(TOP_LEVEL) - {"version"}
"""Statements that open a block only at the top level."""
RECOVERED = "_kvpolicy_recovered_"
"""Name of the placeholder statement that stands in for a line with a syntax error."""

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@cache
def grammar_text() -> str:
    return files("kvpolicy.grammar").joinpath("kvpolicy.lark").read_text(encoding="utf-8")


@dataclass
class _Session:
    """Per-parse state the lexer fills in (the Lark instance is shared)."""

    comments: list[Token] = field(default_factory=list)
    history: list[Token] = field(default_factory=list)
    open_braces: list[tuple[Token, Token]] = field(default_factory=list)
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


_SESSION: ContextVar[_Session] = ContextVar("kvpolicy_parse_session")


class NestingTooDeep(Exception):
    def __init__(self, token: Token, what: str) -> None:
        super().__init__(what)
        self.token = token
        self.what = what


class BadCharacter(Exception):
    def __init__(self, line: int, col: int, char: str) -> None:
        super().__init__(char)
        self.line, self.col, self.char = line, col, char


class PolicyLexer(Lexer):
    """One-regex contextual lexer built from the grammar's terminals."""

    __future_interface__ = 2

    def __init__(self, conf: LexerConf) -> None:
        keywords: dict[str, str] = {}
        punctuation: dict[str, str] = {}
        groups: list[tuple[int, str, str]] = []
        for term in conf.terminals:
            if term.pattern.type == "str":
                table = keywords if _WORD.fullmatch(term.pattern.value) else punctuation
                table[term.pattern.value] = term.name
            else:
                groups.append((-term.priority, term.name, term.pattern.to_regexp()))
        groups.sort()  # higher priority first (ATTRIBUTE before NAME)
        self.keywords = keywords
        self.punctuation = punctuation
        self.ignored = frozenset(conf.ignore)
        alternatives = [f"(?P<{_group(name)}>{regexp})" for _, name, regexp in groups]
        puncts = sorted(punctuation, key=len, reverse=True)
        alternatives.append("(?P<PUNCT>" + "|".join(re.escape(p) for p in puncts) + ")")
        # Spaces before a token are skipped in the same match: a third of the matches
        # a policy needs otherwise. (At the end of the text, or before a character
        # nothing matches, the spaces still match on their own, as the ignored terminal.)
        self.master = re.compile("[ \t\f]*(?:" + "|".join(alternatives) + ")")
        self.group_names = {_group(name): name for _, name, _ in groups}

    def lex(self, lexer_state, parser_state) -> Iterator[Token]:  # type: ignore[override]
        text: str = lexer_state.text.text
        session = _SESSION.get()
        states = parser_state.parse_conf.parse_table.states
        match = self.master.match
        keywords, punctuation, ignored, names = (
            self.keywords,
            self.punctuation,
            self.ignored,
            self.group_names,
        )
        history = session.history
        line, line_start, pos, end_of_text = 1, 0, 0, len(text)
        parens = session.open_parens
        statement_head: Token | None = None
        nots = 0  # 'not's in a row: each nests the condition one level deeper
        after_sep = False
        new_token = _NEW_TOKEN
        while pos < end_of_text:
            m = match(text, pos)
            if m is None:
                raise BadCharacter(line, pos - line_start + 1, text[pos])
            group = m.lastgroup
            kind = names.get(group, group)
            value = m.group(group)
            end = m.end()
            pos = end - len(value)  # where the token starts, after any spaces
            col = pos - line_start + 1
            if kind in ignored:
                if kind == "COMMENT":
                    session.comments.append(
                        new_token("COMMENT", value, pos, line, col, line, col + len(value), end)
                    )
                pos = end
                continue
            if kind == "_SEP":
                token = None if after_sep else new_token("_SEP", value, pos, line, col, line, col + 1, end)
                if value != ";":
                    line += 1
                    line_start = end
                    if parens:  # newlines inside parentheses do not end a statement
                        pos = end
                        continue
                pos = end
                statement_head = None
                # A run of separators (blank lines, comment lines, ';' at a line's end)
                # is passed on as one: the grammar takes any number wherever it takes one.
                if token is not None:
                    after_sep = True
                    history.append(token)
                    yield token
                continue
            after_sep = False
            if kind == "NAME":
                keyword = keywords.get(value)
                if keyword is not None and (
                    _would_shift(states, parser_state.state_stack, keyword)
                    or not _would_shift(states, parser_state.state_stack, "NAME")
                ):
                    kind = keyword
            elif kind == "PUNCT":
                kind = punctuation[value]
            token = new_token(kind, value, pos, line, col, line, col + len(value), end)
            if statement_head is None:
                statement_head = token
            if kind == "NOT":
                nots += 1
                if nots + len(parens) > MAX_NESTING:
                    raise NestingTooDeep(token, f"conditions nested more than {MAX_NESTING} deep")
            elif value != "(":
                nots = 0
            if value == "(":
                parens.append(token)
                if len(parens) + nots > MAX_NESTING:
                    raise NestingTooDeep(token, f"parentheses nested more than {MAX_NESTING} deep")
            elif value == ")" and parens:
                parens.pop()
            elif value == "{":
                if session.open_braces and statement_head is not None and statement_head.value in TOP_LEVEL_BLOCKS:
                    session.nested_heads.append((statement_head, tuple(session.open_braces)))
                session.open_braces.append((token, statement_head))
                session.blocks.append((token, statement_head))
                if len(session.open_braces) > MAX_NESTING:
                    raise NestingTooDeep(token, f"blocks nested more than {MAX_NESTING} deep")
                statement_head = None
            elif value == "}":
                if session.open_braces:
                    session.closed_by[session.open_braces.pop()[0].start_pos] = token
                statement_head = None
            pos = end
            history.append(token)
            yield token


_NEW_TOKEN = getattr(Token, "_future_new", Token)
"""Lark's Token constructor without its check for a deprecated keyword (a third of the cost)."""


def _would_shift(states, stack: list, token_type: str) -> bool:
    """Whether the parser, in the state ``stack``, would shift ``token_type``.

    LALR merges states, so a state's table may list a keyword as a lookahead
    (for a reduction) even where, after the reductions, the keyword is invalid;
    replaying the reductions on a copy of the stack gives the exact answer.
    """
    action = states[stack[-1]].get(token_type)
    if action is None or action[0] is Shift:  # most words: decided without a copy of the stack
        return action is not None
    stack = list(stack)
    while True:
        action = states[stack[-1]].get(token_type)
        if action is None:
            return False
        kind, arg = action
        if kind is Shift:
            return True
        if arg.expansion:
            del stack[-len(arg.expansion) :]
        stack.append(states[stack[-1]][arg.origin.name][1])


def _group(terminal: str) -> str:
    return terminal.lstrip("_") or "SEP"


@cache
def parser() -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer=PolicyLexer,
        keep_all_tokens=True,  # spans and fmt read keywords, braces and separators
        maybe_placeholders=False,
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a policy is parsed and built.

    Parsing allocates tens of thousands of small objects (tokens, tree nodes,
    model nodes) that hold no reference cycles; the collector would scan the
    growing heap again and again for nothing to free, which makes a 10,000-line
    policy take twice as long. Reference counting still frees everything.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class SyntaxResult:
    """A parse tree (of the text with broken lines replaced, when there were errors),
    the comments, and the syntax errors."""

    tree: Tree | None
    comments: list[Token]
    diagnostics: list[Diagnostic]
    kinds: list[str] = field(default_factory=list)
    """The kind of each syntax error found, in the order found (``syntax_messages.ERROR_EXAMPLES``)."""


def parse_tree(text: str, file: str) -> SyntaxResult:
    """Parse ``text``; on syntax errors, recover line by line and report each one."""
    from kvpolicy.policy.syntax_messages import Failure, explain_failure

    original = text.split("\n")
    lines = list(original)
    diagnostics: list[Diagnostic] = []
    kinds: list[str] = []
    recovered: set[int] = set()
    while len(diagnostics) < MAX_ERRORS:
        session = _Session(recovered_lines=frozenset(recovered))
        reset = _SESSION.set(session)
        try:
            tree = parser().parse("\n".join(lines))
            return SyntaxResult(tree, session.comments, diagnostics, kinds)
        except (UnexpectedToken, BadCharacter, NestingTooDeep) as exc:
            failure: Failure = explain_failure(exc, session, lines, file)
        finally:
            _SESSION.reset(reset)
        line = failure.recover_line
        if line in recovered:
            break  # the placeholder did not help: the first report stands
        for diagnostic in (failure.diagnostic, *failure.also):
            diagnostics.append(_inside(diagnostic, original))
        kinds.append(failure.kind)
        if line is None:
            break
        recovered.add(line)
        if failure.replacement is not None:
            lines[line - 1] = failure.replacement
        else:
            open_before = sum(1 for brace, _ in session.open_braces if brace.line < line)
            lines[line - 1] = _placeholder(lines[line - 1], open_before)
    return SyntaxResult(None, [], diagnostics, kinds)


def _inside(diagnostic: Diagnostic, lines: list[str]) -> Diagnostic:
    """``diagnostic`` with its position inside the original text (a position found in
    a line that recovery replaced can lie past that line's end)."""
    line = min(diagnostic.line, len(lines))
    col = min(diagnostic.col, len(lines[line - 1]) + 1)
    end_line = min(max(diagnostic.end_line, line), len(lines))
    end_col = min(diagnostic.end_col, len(lines[end_line - 1]) + 1)
    if (end_line, end_col) <= (line, col):
        end_line, end_col = line, col + 1
    if (line, col, end_line, end_col) == (diagnostic.line, diagnostic.col, diagnostic.end_line, diagnostic.end_col):
        return diagnostic
    return diagnostic.model_copy(update={"line": line, "col": col, "end_line": end_line, "end_col": end_col})


def _placeholder(line: str, open_before: int) -> str:
    """What replaces a broken line: its net braces survive, so blocks stay balanced.

    A ``}`` survives only if a block is open before the line (else it is the error).
    """
    opens = closes = 0
    for m in re.finditer(r'"(?:[^"\\\n]|\\[^\n])*"|#.*|[{}]', line):
        if m.group() == "{":
            opens += 1
        elif m.group() == "}":
            if opens:
                opens -= 1
            elif closes < open_before:
                closes += 1
    indent = line[: len(line) - len(line.lstrip())]  # kept: indentation tells where blocks end
    return indent + "}" * closes + (f"{RECOVERED} {{" if opens else "") + "{" * max(0, opens - 1)
