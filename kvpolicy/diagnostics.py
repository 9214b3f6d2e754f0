"""Source spans, diagnostics and PolicyError (the base layer: every layer above reports through these).

Syntax errors, semantic errors and lint findings are one family: a ``Diagnostic``
with a position, a stable code and name, a severity, a message in the user's words
and, separately, a hint that says how to fix it.
"""

from __future__ import annotations

import re
from enum import Enum

from pydantic import BaseModel, ConfigDict

_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
"""What a terminal would act on instead of showing: control characters (ESC starts an escape
sequence, CR returns the carriage) and invisible format characters (bidi overrides)."""


def printable(text: str) -> str:
    """``text`` safe to write to a terminal: each control or format character as an escape
    (``\\x1b``, ``\\u202e``); tabs and newlines stay."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class DocumentedCode:
    """A stable code with its reference documentation (a lint rule's, a document error's): ``doc`` is a
    summary sentence, a blank line, then sections under ``## Heading`` lines."""

    code: str
    name: str
    doc: str

    def summary(self) -> str:
        """The documentation's first line: what the code reports, in one sentence."""
        return self.doc.splitlines()[0]

    def sections(self) -> dict[str, str]:
        """The documentation's sections by heading, stripped."""
        parts = re.split(r"^## (.+)$", self.doc, flags=re.M)
        return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}

    def anchor(self) -> str:
        """Its anchor in the generated reference: GitHub's for the heading ``KV001 unknown-unit``."""
        return f"{self.code.lower()}-{self.name}"


class Span(BaseModel):
    """A 1-based, end-exclusive region of the source: ``line:col`` to ``end_line:end_col``."""

    model_config = ConfigDict(frozen=True)

    line: int
    col: int
    end_line: int
    end_col: int

    @classmethod
    def point(cls, line: int, col: int) -> Span:
        return cls(line=line, col=col, end_line=line, end_col=col + 1)

    def to(self, other: Span) -> Span:
        """The span from the start of ``self`` to the end of ``other``."""
        return Span(line=self.line, col=self.col, end_line=other.end_line, end_col=other.end_col)

    def moved(self, lines: int) -> Span:
        """The same span ``lines`` lines further down (up, for a negative number)."""
        return Span(line=self.line + lines, col=self.col, end_line=self.end_line + lines, end_col=self.end_col)


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


class Diagnostic(BaseModel):
    """One finding; its JSON shape is ``kvpolicy lint``'s, in docs/json.md."""

    model_config = ConfigDict(frozen=True)

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    code: str
    name: str
    severity: Severity
    message: str
    hint: str | None = None

    @property
    def span(self) -> Span:
        return Span(line=self.line, col=self.col, end_line=self.end_line, end_col=self.end_col)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.file, self.line, self.col, self.code)

    def render(self) -> str:
        """``file:line:col: CODE severity: message`` and, on its own line, the hint (both
        ``printable``: a policy's words may hold control characters)."""
        text = f"{printable(self.file)}:{self.line}:{self.col}: {self.code} {self.severity.value}: {printable(self.message)}"
        if self.hint:
            text += f"\n  hint: {printable(self.hint)}"
        return text


class PolicyError(Exception):
    """A policy that cannot be used: at least one error diagnostic.

    ``str()`` is the first error in the usual ``file:line:col: CODE`` form;
    ``diagnostics`` holds all of them, errors and warnings, in source order.
    """

    def __init__(self, diagnostics: list[Diagnostic] | tuple[Diagnostic, ...]) -> None:
        self.diagnostics = tuple(sorted(diagnostics, key=Diagnostic.sort_key))
        errors = [d for d in self.diagnostics if d.is_error]
        if not errors:
            raise ValueError("PolicyError needs at least one error diagnostic")
        self.first = errors[0]
        super().__init__(self.first.render())

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.is_error)

    @property
    def file(self) -> str:
        return self.first.file

    @property
    def line(self) -> int:
        return self.first.line

    @property
    def col(self) -> int:
        return self.first.col

    @property
    def code(self) -> str:
        return self.first.code
