"""``kvpolicy fmt``: one canonical layout for policy files.

The formatter prints the parse tree (every token kept) and the comments:
two-space indentation, one statement per line, ``40 GiB`` / ``40%`` / ``30s``,
single spaces in expressions, pool blocks on one line with their braces aligned,
at most one blank line in a row (always one between top-level blocks), trailing
comments aligned within a run of lines. Statement order is never changed. Every
comment survives: one that cannot stay where it was (inside an expression that
is joined onto one line) moves to its own line above the statement.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from lark import Token, Tree

from kvpolicy.policy.build import first_token, last_token
from kvpolicy.diagnostics import PolicyError
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

    def emit(self, indent: int, code: str, source_line: int, comment: str | None = None) -> None:
        blank = bool(self.lines) and self._blank_line_before(source_line)
        self.lines.append(_Line(indent, code, comment, blank))
        self._previous_source_line = source_line

    def _blank_line_before(self, source_line: int) -> bool:
        previous = getattr(self, "_previous_source_line", 0)
        return any(not self.source_lines[i - 1].strip() for i in range(previous + 1, source_line))

    # ---- statements ----------------------------------------------------------------

    def print(self) -> str:
        statements = [c for c in self.tree.children if isinstance(c, Tree)]
        previous_was_block = False
        for statement in statements:
            is_block = _has_block(statement)
            start = len(self.lines)
            self.statement(statement, 0)
            if start and (is_block or previous_was_block):
                self.lines[start].blank_before = True
            previous_was_block = is_block
        self.flush_comments(len(self.source_lines) + 1, 0)
        return _render(self.lines)

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
        if tree.data in _SINGLE_LINE_BLOCKS and self.fits_on_one_line(head[0], close, items):
            body = "; ".join(_inline(i) for i in items)
            code = f"{_join(head[:-1])} {{ {body} }}" if items else f"{_join(head[:-1])} {{}}"
            self.emit(indent, code, first.line, self.trailing_comment(close))
            return
        open_brace = head[-1]
        if not items and not self.has_comments_between(first.line, close.line):
            self.emit(indent, f"{_join(head[:-1])} {{}}", first.line, self.trailing_comment(close))
            return
        self.emit(indent, _join(head[:-1]) + " {", first.line, self.trailing_comment(open_brace))
        body = len(self.lines)
        for item in items:
            self.statement(item, indent + 1)
        self.flush_comments(close.line, indent + 1)
        if len(self.lines) > body:
            self.lines[body].blank_before = False  # no blank line right after '{'
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

    def fits_on_one_line(self, first: Token, close: Token, items: list[Tree]) -> bool:
        """A pool block stays on one line unless a comment sits inside it."""
        return not any(_has_block(i) for i in items) and not self.has_comments_between(first.line, close.line)


# ---- tree helpers -------------------------------------------------------------------


def _has_block(tree: Tree) -> bool:
    return any(isinstance(c, Token) and c.type == "LBRACE" for c in tree.children)


def _split_block(tree: Tree) -> tuple[list[Token | Tree], list[Tree], Token]:
    """(header up to and including '{', the block's statements, the '}')."""
    children = tree.children
    brace = next(i for i, c in enumerate(children) if isinstance(c, Token) and c.type == "LBRACE")
    head = children[: brace + 1]
    close = children[-1]
    items = [c for c in children[brace + 1 : -1] if isinstance(c, Tree)]
    return head, items, close


def _tokens(node: Tree | Token) -> list[Token]:
    if isinstance(node, Token):
        return [] if node.type in _SEPARATOR_TYPES else [node]
    out: list[Token] = []
    for child in node.children:
        out.extend(_tokens(child))
    return out


def _inline(node: Tree | Token) -> str:
    return _join(_tokens(node) if isinstance(node, Tree) else [node])


def _join(parts: list[Token | Tree]) -> str:
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
