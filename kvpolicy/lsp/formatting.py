"""Formatting: ``kvpolicy fmt``'s output as the few edits that turn the text into it.

Replacing only the lines that change keeps the editor's cursor, folds and marks
where they were. A text with a syntax error is not formatted (``FormatRefused``).
"""

from __future__ import annotations

import difflib

from kvpolicy.lsp.actions import Edit
from kvpolicy.lsp.language import format_policy
from kvpolicy.lsp.positions import Pos, Region


def format_edits(text: str, file: str) -> list[Edit]:
    """The edits from ``text`` to its formatted form; raises FormatRefused on a syntax error."""
    return line_edits(text, format_policy(text, file))


def line_edits(old: str, new: str) -> list[Edit]:
    """Edits that replace whole lines of ``old`` to give ``new``."""
    a, b = _chunks(old), _chunks(new)
    lines = old.split("\n")
    end = Pos(len(lines) - 1, len(lines[-1]))

    def start_of(i: int) -> Pos:
        return Pos(i, 0) if i < len(a) else end

    return [
        Edit(Region(start_of(i1), start_of(i2)), "".join(b[j1:j2]))
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
        if tag != "equal"
    ]


def _chunks(text: str) -> list[str]:
    """The lines of ``text``, each with its newline (the last may have none)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
