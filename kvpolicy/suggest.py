"""Did-you-mean suggestions: keywords, units, fields, attributes and pool names, command names and options, JSON keys."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` was most likely meant to be, or None.

    A case-insensitive exact match wins (``gib`` → ``GiB``); otherwise the closest
    by edit similarity, if it is close enough to be worth saying.
    """
    pool = list(dict.fromkeys(candidates))
    folded = {c.lower(): c for c in pool}
    if word.lower() in folded and folded[word.lower()] != word:
        return folded[word.lower()]
    matches = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not matches:
        matches = difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=0.6)
        matches = [folded[m] for m in matches]
    if not matches and len(word) >= 2:
        # Short words are far apart by ratio even when one keystroke apart (c5 → c4).
        matches = [c for c in pool if _one_edit_apart(word, c)]
    return matches[0] if matches and matches[0] != word else None


def _one_edit_apart(a: str, b: str) -> bool:
    """One substitution, insertion, deletion or swap of neighbours turns ``a`` into ``b``."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def did_you_mean(word: str, candidates: Iterable[str], quote: str = "'") -> str | None:
    """``"did you mean 'GiB'?"`` or None."""
    match = closest(word, candidates)
    return f"did you mean {quote}{match}{quote}?" if match else None
