"""Source spans, diagnostics and PolicyError (the base layer: every layer above reports through these).

Syntax errors, semantic errors and lint findings are one family: a ``Diagnostic``
with a position, a stable code and name, a severity, a message in the user's words
and, separately, a hint that says how to fix it.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict


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
        """``file:line:col: CODE severity: message`` and, on its own line, the hint."""
        text = f"{self.file}:{self.line}:{self.col}: {self.code} {self.severity.value}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
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
