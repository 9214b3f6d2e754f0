"""``kvpolicy fmt``: one canonical layout for policy files.

The formatter prints the parse tree (every token kept) and the comments:
two-space indentation, one statement per line, ``40 GiB`` / ``40%`` / ``30s``,
single spaces in expressions, pool blocks on one line with their braces aligned,
at most one blank line in a row (always one between top-level blocks), trailing
comments aligned within a run of lines. Statement order is never changed. Every
comment survives: one that cannot stay where it was (inside an expression that
is joined onto one line) moves to its own line above the statement.

Formatting never changes what lint reports. A suppression (``# kvpolicy:
ignore[...]``) covers one line, so the code on a covered line stays together on
one line of its own: statements that share it stay there, joined by ``; `` (a
block among them on one line too); a block whose '}' line is covered keeps its '}' there
rather than close up onto its header's line, and one whose header is covered keeps its
items on their own lines. Where the canonical layout cannot keep that
(the line holds part of a block's header and its first item, or part of a
condition written over several lines), the top-level statements around it are
left exactly as written.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from lark import Tree

from kvpolicy.policy.build import first_token, last_token
from kvpolicy.policy.lark_parser import Token
from kvpolicy.diagnostics import PolicyError
from kvpolicy.policy.suppressions import covered_lines, is_suppression
from kvpolicy.policy.syntax import gc_paused, parse_tree
from kvpolicy.units import DURATION_UNITS

INDENT = "  "
_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))[ \t]*(%|[A-Za-z_][A-Za-z0-9_]*)?")
_SINGLE_LINE_BLOCKS = ("pool",)
_SEPARATOR_TYPES = ("_SEP",)


def format_text(text: str, file: str = "<policy>") -> str:
    """The canonical form of ``text``; raises PolicyError if it has syntax errors."""
    with gc_paused():
        syntax = parse_tree(text, file)
        if syntax.diagnostics or syntax.tree is None:
            raise PolicyError(syntax.diagnostics)
        return _Printer(text, syntax.tree, syntax.comments).print()


@dataclass
class _Line:
    indent: int
    code: str
    comment: str | None = None
    blank_before: bool = False


@dataclass
class _Printer:
    source: str
    tree: Tree
    comments: list[Token]
    lines: list[_Line] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source_lines = self.source.split("\n")
        self.pending = deque(sorted(self.comments, key=lambda c: (c.line, c.column)))  # taken from the front
        suppressions = [c for c in self.pending if is_suppression(c.value)]
        self.pinned = sorted(set(covered_lines(self.source_lines, [(c.line, c.column) for c in suppressions])))
        """The lines suppressions cover: their code stays together on one line of its own."""
        self.last_on_line: dict[int, Token] = {}
        for token in self.tree.scan_values(lambda t: isinstance(t, Token)):
            if token.type not in _SEPARATOR_TYPES:
                known = self.last_on_line.get(token.line)
                if known is None or token.column > known.column:
                    self.last_on_line[token.line] = token

    # ---- comments --------------------------------------------------------------

    def flush_comments(self, before_line: int, indent: int) -> None:
        """Emit, on their own lines, the comments above ``before_line`` not yet printed."""
        while self.pending and self.pending[0].line < before_line:
            comment = self.pending.popleft()
            self.emit(indent, comment.value.rstrip(), comment.line)

    def trailing_comment(self, last: Token) -> str | None:
        """The comment after ``last`` on its line, if ``last`` is the line's last token."""
        if self.last_on_line.get(last.line) is not last:
            return None
        for i, comment in enumerate(self.pending):
            if comment.line == last.line:
                del self.pending[i]
                return comment.value.rstrip()
            if comment.line > last.line:
                break
        return None

    def emit(self, indent: int, code: str, source_line: int, comment: str | None = None, last_line: int = 0) -> None:
        """One printed line, made of the source lines ``source_line`` to ``last_line`` (a block
        joined onto one line): the next line's blank line, and the covered lines left to
        print, are counted from the last of them."""
        blank = bool(self.lines) and self._blank_line_before(source_line)
        self.lines.append(_Line(indent, code, comment, blank))
        self._previous_source_line = max(source_line, last_line)

    def _blank_line_before(self, source_line: int) -> bool:
        previous = getattr(self, "_previous_source_line", 0)
        return any(not self.source_lines[i - 1].strip() for i in range(previous + 1, source_line))

    # ---- statements ----------------------------------------------------------------

    def print(self) -> str:
        statements = [c for c in self.tree.children if isinstance(c, Tree)]
        previous_was_block = False
        for group in _line_groups(statements):
            self.separator_lines(first_token(group[0]).line)
            if self.keeps_pins(group, None, None):
                units = self.items(group, 0)
            else:
                units = [(len(self.lines), any(_has_block(s) for s in group))]
                self.verbatim(group)
            for start, is_block in units:
                if start and (is_block or previous_was_block):
                    self.lines[start].blank_before = True
                previous_was_block = is_block
        self.separator_lines(len(self.source_lines) + 1)
        self.flush_comments(len(self.source_lines) + 1, 0)
        return _render(self.lines)

    def separator_lines(self, before_line: int) -> None:
        """A covered line between statements with only separators on it stays: dropping it
        would hand its suppression to the next statement."""
        after = getattr(self, "_previous_source_line", 0)
        for line in self.pinned[bisect_left(self.pinned, after + 1) : bisect_left(self.pinned, before_line)]:
            if self.source_lines[line - 1].strip() and not self.source_lines[line - 1].strip().startswith("#"):
                self.flush_comments(line, 0)
                on_line = [c for c in self.pending if c.line == line]
                self.pending = deque(c for c in self.pending if c.line != line)
                code = self.source_lines[line - 1][: on_line[0].column - 1] if on_line else self.source_lines[line - 1]
                self.emit(0, code.strip(), line, " ".join(c.value.rstrip() for c in on_line) or None)

    def items(self, items: list[Tree], indent: int) -> list[tuple[int, bool]]:
        """Statements one per line, except those that share a covered line: one line together.
        Returns where each printed unit starts in ``lines`` and whether it holds a block."""
        units: list[tuple[int, bool]] = []
        i = 0
        while i < len(items):
            line = first_token(items[i]).line
            j = i
            if self.is_pinned(line):
                while j < len(items) and first_token(items[j]).line == last_token(items[j]).line == line:
                    j += 1
            if j - i > 1 or (j > i and _has_block(items[i])):
                units.append((len(self.lines), any(_has_block(item) for item in items[i:j])))
                self.flush_comments(line, indent)
                code = "; ".join(_one_line(item) for item in items[i:j])
                self.emit(indent, code, line, self.trailing_comment(last_token(items[j - 1])))
                i = j
            else:
                units.append((len(self.lines), _has_block(items[i])))
                self.statement(items[i], indent)
                i += 1
        return units

    def is_pinned(self, line: int) -> bool:
        at = bisect_left(self.pinned, line)
        return at < len(self.pinned) and self.pinned[at] == line

    def keeps_pins(self, items: list[Tree], head_line: int | None, close_line: int | None) -> bool:
        """Whether ``items`` (a block's, between its '{' line and its '}' line; None at the top
        level), printed by ``items()``, keep every covered line's code on one line of its own."""
        if not items or not self.pinned:
            return True
        spans = [(first_token(x).line, last_token(x).line) for x in items]
        ends = [b for _, b in spans]
        lo, hi = bisect_left(self.pinned, spans[0][0]), bisect_left(self.pinned, spans[-1][1] + 1)
        for line in self.pinned[lo:hi]:
            k = bisect_left(ends, line)
            touching = []
            while k < len(items) and spans[k][0] <= line:
                touching.append(k)
                k += 1
            if not touching:
                if self.source_lines[line - 1].strip():  # code of no statement: separators alone
                    return False
                continue
            if line in (head_line, close_line):
                return False  # the block's brace and its items share the line: the layout splits them
            if all(spans[t][0] == spans[t][1] == line for t in touching):
                continue  # one line of statements: printed together
            if len(touching) > 1 or not _has_block(items[touching[0]]):
                return False  # a statement over several lines shares it, or would be joined onto one
        for x, (a, b) in zip(items, spans):
            if a != b and _has_block(x) and bisect_left(self.pinned, a) != bisect_left(self.pinned, b + 1):
                _, inner, close = _split_block(x)
                if not self.keeps_pins(inner, a, close.line):
                    return False
        return True

    def verbatim(self, group: list[Tree]) -> None:
        """The statements' lines exactly as written (their comments with them)."""
        first, last = first_token(group[0]).line, last_token(group[-1]).line
        self.flush_comments(first, 0)
        self.pending = deque(c for c in self.pending if not first <= c.line <= last)
        self.emit(0, self.source_lines[first - 1].rstrip(), first)
        for number in range(first + 1, last + 1):
            self.lines.append(_Line(0, self.source_lines[number - 1].rstrip()))
        self._previous_source_line = last

    def statement(self, tree: Tree, indent: int) -> None:
        first = first_token(tree)
        self.flush_comments(first.line, indent)
        if not _has_block(tree):
            last = last_token(tree)
            # comments inside a statement that is joined onto one line go above it
            self.flush_comments_within(first.line, last.line, indent)
            self.emit(indent, _inline(tree), first.line, self.trailing_comment(last))
            return
        head, items, close = _split_block(tree)
        if tree.data in _SINGLE_LINE_BLOCKS and self.fits_on_one_line(first, close, items):
            body = "; ".join(_inline(i) for i in items)
            code = f"{_join(head[:-1])} {{ {body} }}" if items else f"{_join(head[:-1])} {{}}"
            self.emit(indent, code, first.line, self.trailing_comment(close), close.line)
            return
        open_brace = head[-1]
        assert isinstance(open_brace, Token)  # the head ends with the '{'
        if not items and self.may_join(first, close):
            self.emit(indent, f"{_join(head[:-1])} {{}}", first.line, self.trailing_comment(close), close.line)
            return
        self.emit(indent, _join(head[:-1]) + " {", first.line, self.trailing_comment(open_brace))
        body_start = len(self.lines)
        self.items(items, indent + 1)
        self.flush_comments(close.line, indent + 1)
        if len(self.lines) > body_start:
            self.lines[body_start].blank_before = False  # no blank line right after '{'
        self.emit(indent, "}", close.line, self.trailing_comment(close))
        self.lines[-1].blank_before = False  # nor right before '}'

    def flush_comments_within(self, first_line: int, last_line: int, indent: int) -> None:
        moved = [c for c in self.pending if first_line <= c.line < last_line]
        for comment in moved:
            self.pending.remove(comment)
            self.emit(indent, comment.value.rstrip(), first_line)

    def has_comments_between(self, first_line: int, close_line: int) -> bool:
        """Whether a comment sits on the lines from ``first_line`` up to (not on) the '}' line."""
        return any(first_line <= c.line < close_line for c in self.pending)

    def may_join(self, first: Token, close: Token, has_items: bool = False) -> bool:
        """Whether a block's lines may become one: not with a comment inside it, nor when a
        suppression covers a line joining would change: its '}' line (joined, the suppression
        would cover the header), or its header while items on other lines would join it."""
        if self.has_comments_between(first.line, close.line):
            return False
        if close.line == first.line:
            return True
        return not self.is_pinned(close.line) and not (has_items and self.is_pinned(first.line))

    def fits_on_one_line(self, first: Token, close: Token, items: list[Tree]) -> bool:
        """A pool block stays on one line unless a comment sits inside it or joining would move
        code onto or off a line a suppression covers."""
        return not any(_has_block(i) for i in items) and self.may_join(first, close, bool(items))


# ---- tree helpers -------------------------------------------------------------------


def _has_block(tree: Tree) -> bool:
    return any(isinstance(c, Token) and c.type == "LBRACE" for c in tree.children)


def _split_block(tree: Tree) -> tuple[list[Token | Tree], list[Tree], Token]:
    """(header up to and including '{', the block's statements, the '}')."""
    children = tree.children
    brace = next(i for i, c in enumerate(children) if isinstance(c, Token) and c.type == "LBRACE")
    head = children[: brace + 1]
    close = children[-1]
    assert isinstance(close, Token)  # a block ends with its '}'
    items = [c for c in children[brace + 1 : -1] if isinstance(c, Tree)]
    return head, items, close


def _line_groups(statements: list[Tree]) -> list[list[Tree]]:
    """Consecutive statements joined by sharing a line (``a; b``, ``} model ... {``)."""
    groups: list[list[Tree]] = []
    for statement in statements:
        if groups and first_token(statement).line == last_token(groups[-1][-1]).line:
            groups[-1].append(statement)
        else:
            groups.append([statement])
    return groups


def _one_line(node: Tree) -> str:
    """A statement on one line; a block as ``head { item; item }``."""
    if not _has_block(node):
        return _inline(node)
    head, items, _ = _split_block(node)
    body = "; ".join(_one_line(i) for i in items)
    return f"{_join(head[:-1])} {{ {body} }}" if items else f"{_join(head[:-1])} {{}}"


def _tokens(node: Tree | Token) -> list[Token]:
    if isinstance(node, Token):
        return [] if node.type in _SEPARATOR_TYPES else [node]
    out: list[Token] = []
    for child in node.children:
        out.extend(_tokens(child))
    return out


def _inline(node: Tree | Token) -> str:
    return _join(_tokens(node) if isinstance(node, Tree) else [node])


def _join(parts: Sequence[Token | Tree]) -> str:
    tokens: list[Token] = []
    for part in parts:
        tokens.extend(_tokens(part))
    out = ""
    for i, token in enumerate(tokens):
        text = _canonical(token)
        if i and not (token.value in (",", ")") or tokens[i - 1].value == "("):
            out += " "
        out += text
    return out


def _canonical(token: Token) -> str:
    if token.type != "QUANTITY":
        return token.value
    match = _QUANTITY.fullmatch(token.value)
    assert match is not None, f"not a quantity: {token.value!r}"
    number, unit = match.group(1), match.group(2)
    if unit is None:
        return number
    if unit == "%" or unit in DURATION_UNITS:
        return number + unit
    return f"{number} {unit}"


def _render(lines: list[_Line]) -> str:
    rendered: list[list[str]] = []  # [code, comment]
    run: list[list[str]] = []  # consecutive code lines, one indentation, with trailing comments
    run_indent = -1

    def close_run() -> None:
        nonlocal run_indent
        run_indent = -1
        width = max((len(r[0]) for r in run), default=0)
        for r in run:
            r[0] = r[0].ljust(width)
        run.clear()

    for line in _align_pools(lines):
        if line.blank_before:
            close_run()
            rendered.append(["", ""])
        row = [INDENT * line.indent + line.code, line.comment or ""]
        rendered.append(row)
        if line.indent != run_indent:
            close_run()
            run_indent = line.indent
        if line.comment and not line.code.startswith("#"):
            run.append(row)
        else:
            close_run()
    close_run()
    return "\n".join(code + (f"  {comment}" if comment else "") for code, comment in rendered) + "\n"


def _align_pools(lines: list[_Line]) -> list[_Line]:
    """Consecutive one-line pool blocks get their '{' in one column."""
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and _is_pool_line(lines[j]) and lines[j].indent == lines[i].indent and (j == i or not lines[j].blank_before):
            j += 1
        if j - i > 1:
            width = max(lines[k].code.index(" {") for k in range(i, j))
            for k in range(i, j):
                name, rest = lines[k].code.split(" {", 1)
                lines[k].code = name.ljust(width) + " {" + rest
        i = max(j, i + 1)
    return lines


def _is_pool_line(line: _Line) -> bool:
    return line.code.startswith("pool ") and line.code.endswith("}") and " {" in line.code
