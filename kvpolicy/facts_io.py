"""Reading facts JSON (files, standard input, test fixtures) with errors people can act on."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from kvpolicy.facts import Facts
from kvpolicy.validation import describe


class FactsError(Exception):
    """Facts that cannot be used: the message names the file and the field."""


class FactsUnreadable(FactsError):
    """The facts file cannot be read at all (missing, a directory, no permission): a usage error."""


def parse_facts(text: str, source: str = "<facts>") -> Facts:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FactsError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise FactsError(f"{source}: not valid facts: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise FactsError(f"{source}: not valid facts: {exc}") from None
    try:
        return Facts.model_validate(data)
    except ValidationError as exc:
        raise FactsError(f"{source}: invalid facts: {describe(exc, Facts)}") from None
    except RecursionError:
        raise FactsError(f"{source}: not valid facts: nested too deeply") from None


def read_facts(path: Path | str) -> Facts:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FactsUnreadable(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FactsError(f"{path}: not valid UTF-8 (byte {exc.start}: {data[exc.start]:#04x}); facts are UTF-8 JSON") from None
    return parse_facts(text, str(path))
