"""``--format json`` keeps its promise when a command fails: one JSON document on stdout.

A command that stops before it has its document (an input it cannot read or use) says why
on standard error and exits 1 or 2, and stdout stays empty: a tool parsing it would have
nothing to parse. ``one_document`` runs such a command with what it writes to standard
error also kept (as well as shown), and if it failed without writing to stdout, prints

    {"schema": 1, "error": {"status": 2, "message": "kvpolicy explain: p.kvp: no such file",
                            "diagnostics": [], "more": 0}}

(``message``: what it wrote to standard error, without colour). Where the failure is a document
with problems (facts, a state: ``kvpolicy.document_codes``) or a policy with errors, the command
reports their diagnostics as it prints them, and ``diagnostics`` carries them as ``kvpolicy
lint``'s JSON does, ``more`` how many problems were not shown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, Literal, Protocol, TextIO

from pydantic import BaseModel, ConfigDict, Field

from kvpolicy.diagnostics import Diagnostic
from kvpolicy.json_text import render_problems

MAX_MESSAGE_CHARS = 64 * 1024
"""What the error document keeps of standard error (the start of it: the first reasons)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ErrorDetail(BaseModel):
    """Why a command failed without its document."""

    status: int
    """Its exit status: 1, the input is invalid; 2, a usage error or a file that cannot be read."""
    message: str
    """What it wrote to standard error, without colour (the start of it, ``MAX_MESSAGE_CHARS``)."""
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    """The problems of the input at fault with their places and codes (``kvpolicy lint``'s shape)."""
    more: int = 0
    """How many problems of it were not shown (past the first of a document's)."""


class ErrorDocument(BaseModel):
    """What ``--format json`` prints when a command fails before it has its document."""

    model_config = ConfigDict(populate_by_name=True)

    schema_: Literal[1] = Field(default=1, alias="schema")
    error: ErrorDetail


class _Reported:
    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []
        self.more = 0


_REPORTED: ContextVar[_Reported | None] = ContextVar("_REPORTED", default=None)


def report(diagnostics: Iterable[Diagnostic], more: int = 0) -> None:
    """Diagnostics a command printed for the input it fails on, for the error document (nothing
    outside ``one_document``)."""
    reported = _REPORTED.get()
    if reported is not None:
        reported.diagnostics.extend(diagnostics)
        reported.more += more


class Problems(Protocol):
    """An input's problems: ``DocumentInvalid``, ``FactsError``, ``RuleStateInvalid``..."""

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]: ...

    @property
    def more(self) -> int: ...


def refuse_document(problems: Problems, command: str) -> None:
    """Print the problems of a document to standard error, as ``kvpolicy lint`` prints diagnostics
    (and the count of those not shown), and ``report`` them; problems without diagnostics as
    ``kvpolicy COMMAND: MESSAGE``."""
    if not problems.diagnostics:
        print(f"kvpolicy {command}: {problems}", file=sys.stderr)
        return
    print(render_problems(problems.diagnostics, problems.more), file=sys.stderr)
    report(problems.diagnostics, problems.more)


class _Watched:
    """A text stream that passes every write on, and notes that there was one (and keeps the
    first ``keep`` characters written)."""

    def __init__(self, stream: TextIO, keep: int = 0) -> None:
        self._stream, self._keep = stream, keep
        self.written = False
        self.kept: list[str] = []

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        if self._keep > 0:
            self.kept.append(text[: self._keep])
            self._keep -= len(self.kept[-1])
        return self._stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # isatty, flush, buffer, encoding...: the stream's own
        return getattr(self._stream, name)


def one_document(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``run(args)``; if it fails with nothing on stdout, the error document there."""
    out, err = _Watched(sys.stdout), _Watched(sys.stderr, keep=MAX_MESSAGE_CHARS)
    reported = _Reported()
    token = _REPORTED.set(reported)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = int(run(args))
    finally:
        _REPORTED.reset(token)
    if status != 0 and not out.written:
        message = _ANSI.sub("", "".join(err.kept)).strip()
        detail = ErrorDetail(status=status, message=message, diagnostics=reported.diagnostics, more=reported.more)
        print(json.dumps(ErrorDocument(error=detail).model_dump(mode="json", by_alias=True), indent=2))
    return status
