"""Reading facts JSON with errors that say which file and which field."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from kvpolicy.facts import Facts
from kvpolicy.validation import describe


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
        raise FactsError(f"{source}: invalid facts: {describe(exc, Facts)}") from None


def read_facts(path: Path | str) -> Facts:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FactsError(f"{path}: {exc.strerror}") from None
    return parse_facts(text, str(path))
