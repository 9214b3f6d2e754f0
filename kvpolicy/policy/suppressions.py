"""Where a ``# kvpolicy: ignore[CODE] reason`` comment acts: the one definition lint and fmt share.

After code on a line, a suppression covers that line; alone on its line, the next
line that has code (not blank, not only a comment). Lint silences findings on the
covered line; fmt keeps the covered line's code together on one line of its own,
so formatting never moves a finding into or out of a suppression's reach.
"""

from __future__ import annotations

import re

SUPPRESSION = re.compile(r"#\s*kvpolicy:\s*ignore\[([^\]]*)\](.*)")
"""A suppression comment: group 1 the codes, group 2 the reason."""


def is_suppression(comment: str) -> bool:
    return SUPPRESSION.match(comment) is not None


def covered_lines(lines: list[str], positions: list[tuple[int, int]]) -> list[int]:
    """The line each suppression at ``(line, col)`` (1-based) covers; one pass over ``lines``
    (none without suppressions)."""
    if not positions:
        return []
    next_code = [0] * (len(lines) + 2)  # next_code[n]: the first line after n with code, or 0
    for number in range(len(lines), 0, -1):
        stripped = lines[number - 1].strip()
        next_code[number - 1] = number if stripped and not stripped.startswith("#") else next_code[number]
    covered = []
    for line, col in positions:
        if lines[line - 1][: col - 1].strip():
            covered.append(line)
        else:
            covered.append(next_code[line] or line)
    return covered
