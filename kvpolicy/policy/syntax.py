"""Text → Lark parse tree, with syntax errors people can act on.

The text is parsed by ``lark_parser``; a syntax error is explained by
``syntax_messages`` (in the user's words, where the fix goes), then the offending
line is replaced (keeping its braces balanced) and the text parsed again, so one run
reports several errors.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from lark import Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from kvpolicy.diagnostics import Diagnostic
from kvpolicy.policy.lark_parser import NestingTooDeep, Token, Trace, parse
from kvpolicy.policy.syntax_messages import explain_failure
from kvpolicy.policy.vocabulary import RECOVERED

MAX_ERRORS = 20


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

    tree: Tree[Token] | None
    comments: list[Token]
    diagnostics: list[Diagnostic]
    kinds: list[str] = field(default_factory=list)
    """The kind of each syntax error found, in the order found (``syntax_messages.MATCHERS``)."""


def parse_tree(text: str, file: str) -> SyntaxResult:
    """Parse ``text``; on syntax errors, recover line by line and report each one."""
    original = text.split("\n")
    lines = list(original)
    diagnostics: list[Diagnostic] = []
    kinds: list[str] = []
    recovered: set[int] = set()
    while len(diagnostics) < MAX_ERRORS:
        trace = Trace(recovered_lines=frozenset(recovered))
        try:
            tree = parse("\n".join(lines), trace)
            return SyntaxResult(tree, trace.comments, diagnostics, kinds)
        except (UnexpectedToken, UnexpectedCharacters, NestingTooDeep) as exc:
            matcher, failure = explain_failure(exc, trace, lines, file)
        line = failure.recover_line
        if line in recovered:
            break  # the placeholder did not help: the first report stands
        for diagnostic in (failure.diagnostic, *failure.also):
            diagnostics.append(_inside(diagnostic, original))
        kinds.append(matcher.kind)
        if line is None:
            break
        recovered.add(line)
        if failure.replacement is not None:
            lines[line - 1] = failure.replacement
        else:
            open_before = sum(1 for brace, _ in trace.open_braces if brace.line < line)
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
