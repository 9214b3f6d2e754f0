"""Did-you-mean suggestions for keywords, units, fields, attributes and pool names."""

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
    return matches[0] if matches and matches[0] != word else None


def did_you_mean(word: str, candidates: Iterable[str], quote: str = "'") -> str | None:
    """``"did you mean 'GiB'?"`` or None."""
    match = closest(word, candidates)
    return f"did you mean {quote}{match}{quote}?" if match else None
