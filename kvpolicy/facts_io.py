"""Reading facts JSON with errors that say which file and which field."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from kvpolicy.facts import Facts


class FactsError(Exception):
    """Facts that cannot be read: the message names the file and the field."""


def parse_facts(text: str, source: str = "<facts>") -> Facts:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FactsError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    try:
        return Facts.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise FactsError(f"{source}: invalid facts: {problems}") from None


def read_facts(path: Path | str) -> Facts:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FactsError(f"{path}: {exc.strerror}") from None
    return parse_facts(text, str(path))
