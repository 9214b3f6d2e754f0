"""``--format json`` keeps its promise when a command fails: one JSON document on stdout.

A command that stops before it has its document (an input it cannot read or use) says why
on standard error and exits 1 or 2, and stdout stays empty: a tool parsing it would have
nothing to parse. ``one_document`` runs such a command with what it writes to standard
error also kept (as well as shown), and if it failed without writing to stdout, prints

    {"schema": 1, "error": {"status": 2, "message": "kvpolicy explain: p.kvp: no such file"}}

(``message``: what it wrote to standard error, without colour).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

MAX_MESSAGE_CHARS = 64 * 1024
"""What the error document keeps of standard error (the start of it: the first reasons)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = int(run(args))
    if status != 0 and not out.written:
        message = _ANSI.sub("", "".join(err.kept)).strip()
        print(json.dumps({"schema": 1, "error": {"status": status, "message": message}}, indent=2))
    return status
