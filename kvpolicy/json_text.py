"""JSON text a person or another program wrote, parsed with what went wrong in words.

``json.loads`` fails three ways on such text: a syntax error (with its place), arrays or
objects nested deeper than the interpreter's stack (``RecursionError``), and an integer past
Python's digit limit (a ``ValueError`` whose message advises calling into ``sys``). Every
reader of such files (facts, model configs, the controller's status) reports them alike, and
a document validated as a model (``load_document``) names the place of its first problem.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound="BaseModel")


class JsonInvalid(ValueError):
    """``problem`` in words; ``line`` and ``col`` (1-based) for a syntax error, else None."""

    def __init__(self, problem: str, line: int | None = None, col: int | None = None) -> None:
        super().__init__(problem)
        self.problem, self.line, self.col = problem, line, col

    def in_file(self, source: object, expected: str) -> str:
        """The message for the file ``source``: ``source:LINE:COL: not valid JSON: ...`` for a syntax
        error, else ``source: not EXPECTED: ...`` (``expected``: "valid facts", "a model config")."""
        if self.line is not None:
            return f"{source}:{self.line}:{self.col}: not valid JSON: {self.problem}"
        return f"{source}: not {expected}: {self.problem}"


def parse_json(text: str) -> Any:
    """``json.loads(text)``; ``JsonInvalid`` for each way it can fail."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonInvalid(exc.msg, exc.lineno, exc.colno) from None
    except RecursionError:
        raise JsonInvalid("nested too deeply") from None
    except ValueError:  # json's one other ValueError: an integer past Python's digit limit
        raise JsonInvalid(f"a number with more than {sys.get_int_max_str_digits()} digits") from None


def decode_json_text(data: bytes) -> str:
    """``data`` as UTF-8 text; ``JsonInvalid`` (no place) where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonInvalid(f"not UTF-8 (byte {exc.start}: {data[exc.start]:#04x})") from None


class DocumentInvalid(ValueError):
    """A JSON document that is not the one expected; the message names the file and the place."""


def load_document(model: type[M], text: str, source: object, *, expected: str, what: str,
                  convert: Callable[[Any], Any] | None = None) -> M:
    """``text`` parsed and validated as ``model``; ``DocumentInvalid`` with the message for ``source``:
    a syntax error as ``JsonInvalid.in_file(source, expected)`` says it, a validation error as
    ``invalid_document(..., what)`` does. ``convert`` reshapes the parsed data first (a status document
    into facts); what it made has no place in ``text``, so its problems are named without one."""
    from pydantic import ValidationError

    try:
        data = parse_json(text)
        shaped = convert(data) if convert is not None else data
        return model.model_validate(shaped)
    except JsonInvalid as exc:
        raise DocumentInvalid(exc.in_file(source, expected)) from None
    except ValidationError as exc:
        raise DocumentInvalid(invalid_document(exc, model, text if shaped is data else None, source, what)) from None
    except RecursionError:  # validating a document nested deeper than parsing it
        raise DocumentInvalid(JsonInvalid("nested too deeply").in_file(source, expected)) from None


def invalid_document(exc: ValidationError, model: type[BaseModel], text: str | None, source: object, what: str) -> str:
    """``source:LINE:COL: invalid WHAT: PROBLEMS``: the document ``text`` (the JSON that ``exc`` was
    raised validating as ``model``) with the place of its first problem; without ``text`` (the data
    was made from another document) no place."""
    from kvpolicy.json_positions import line_col, parse
    from kvpolicy.validation import describe, first_place

    document = parse(text) if text is not None else None
    place = ""
    if document is not None:
        path, is_key = first_place(exc, model)
        line, col = line_col(text or "", document.offset_of(path, key=is_key))
        place = f":{line}:{col}"
    return f"{source}{place}: invalid {what}: {describe(exc, model)}"
