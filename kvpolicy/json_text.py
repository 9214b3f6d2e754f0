"""JSON text a person or another program wrote, parsed with what went wrong in words, and where.

``json.loads`` fails three ways on such text: a syntax error (with its place), arrays or
objects nested deeper than the interpreter's stack (``RecursionError``), and an integer past
Python's digit limit (a ``ValueError`` whose message advises calling into ``sys``). Every
reader of such files (facts, model configs, the controller's status) reports them alike.

The documents people write (facts, policy tests, saved states: ``load_document``) are refused
with a diagnostic per problem, each with its code (``kvpolicy.document_codes``, KVD001...), its
``file:line:col``, the user's words and a hint: the problems of validation each at the value, key
or object it is about, a document of another kind as that kind. A JSON object kvpolicy has no
schema for (a model's ``config.json``: ``read_json_object``) is refused alike for its text, and
keeps its text so that whoever reads its values can place the problems it finds in them.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvpolicy.diagnostics import Diagnostic
from kvpolicy.document_codes import (
    DOCUMENT_TOO_LARGE,
    VALUE_NOT_ALLOWED,
    JSON_SYNTAX,
    MAX_DEPTH,
    MAX_SHOWN,
    MISSING_FIELD,
    NESTED_TOO_DEEPLY,
    NOT_UTF8,
    NUMBER_TOO_LONG,
    UNKNOWN_KEY,
    WRONG_DOCUMENT,
    WRONG_TYPE,
    DocumentCode,
)
from kvpolicy.paths import MAX_INPUT_BYTES, read_bounded
from kvpolicy.units import MiB

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from kvpolicy.json_positions import JsonDocument
    from kvpolicy.validation import Problem

M = TypeVar("M", bound="BaseModel")

Place = tuple[tuple[int, int], tuple[int, int]]
"""Where a problem is: its start and end (exclusive), each a 1-based (line, column)."""


class JsonInvalid(ValueError):
    """``problem`` in words, of ``code`` (``JSON_SYNTAX``, ``NESTED_TOO_DEEPLY``, ...); ``line`` and ``col``
    (1-based) for a syntax error, else None; ``start`` and ``end`` where any problem is, if the text says."""

    def __init__(self, problem: str, line: int | None = None, col: int | None = None, *, code: DocumentCode = JSON_SYNTAX,
                 start: tuple[int, int] | None = None, end: tuple[int, int] | None = None, hint: str | None = None) -> None:
        super().__init__(problem)
        self.problem, self.line, self.col, self.code, self.hint = problem, line, col, code, hint
        self.start = start if start is not None else (line, col) if line is not None and col is not None else None
        self.end = end

    def diagnostic(self, source: object, hint: str | None = None) -> Diagnostic:
        """This problem as a diagnostic of ``source`` (at 1:1 where the text does not say where), with
        ``hint`` instead of its own if given."""
        start = self.start or (1, 1)
        message = f"not valid JSON: {self.problem}" if self.code is JSON_SYNTAX else self.problem
        return self.code.at(str(source), start, self.end or (start[0], start[1] + 1), message, hint or self.hint)


def parse_json(text: str) -> Any:
    """``json.loads(text)``; ``JsonInvalid`` for each way it can fail, at its place."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonInvalid(exc.msg, exc.lineno, exc.colno, hint=_syntax_hint(exc, text)) from None
    except RecursionError:
        raise JsonInvalid("nested too deeply", code=NESTED_TOO_DEEPLY, start=_line_col(text, _too_deep_at(text)),
                          hint=_DEEP_HINT) from None
    except ValueError:  # json's one other ValueError: an integer past Python's digit limit
        raise _number_too_long(text) from None


def decode_json_text(data: bytes) -> str:
    """``data`` as UTF-8 text; ``JsonInvalid`` (of ``NOT_UTF8``, at the first byte that is not) where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8")  # valid up to the first byte that is not
        raise JsonInvalid(f"not UTF-8 (byte {data[exc.start]:#04x})", code=NOT_UTF8, start=_line_col(before, len(before)),
                          hint="save the file as UTF-8") from None


def read_document_text(path: Path | str, *, what: str = "facts, policy test or state file") -> str:
    """The text of a document file people write (facts, a policy test, a state; ``what`` names the kind in a
    hint): ``OSError`` as ``open`` raises it; ``DocumentInvalid`` over ``MAX_INPUT_BYTES`` (KVD003) or not
    UTF-8 (KVD001)."""
    data = read_bounded(path, MAX_INPUT_BYTES)
    if len(data) > MAX_INPUT_BYTES:
        kept = data[:MAX_INPUT_BYTES]
        line_start = kept.rfind(b"\n") + 1
        start = (kept.count(b"\n") + 1, len(kept[line_start:].decode("utf-8", errors="replace")) + 1)
        raise DocumentInvalid([DOCUMENT_TOO_LARGE.at(
            str(path), start, (start[0], start[1] + 1), f"over {MAX_INPUT_BYTES // MiB} MiB: not read further",
            _unlike(what, "is near this size"))])
    try:
        return decode_json_text(data)
    except JsonInvalid as exc:
        raise DocumentInvalid([exc.diagnostic(path)]) from None


class DocumentInvalid(ValueError):
    """A JSON document that is not the one expected: ``diagnostics`` (the first ``MAX_SHOWN`` of its
    problems, in the order of the text) and ``more``, how many others it has. ``str()`` is them as
    ``kvpolicy lint`` prints diagnostics, and a last line that counts the others."""

    def __init__(self, diagnostics: Iterable[Diagnostic], more: int = 0) -> None:
        self.diagnostics = tuple(diagnostics)
        self.more = more
        super().__init__(self.render())

    def render(self, *, hints: bool = True) -> str:
        return render_problems(self.diagnostics, self.more, hints=hints)


class CarriesProblems:
    """Mixed into an error about a document: its problems (``problems``; None where there are none to show,
    e.g. the file could not be read) as ``diagnostics`` and ``more``, which ``--format json``'s error document
    and the commands' refusals read."""

    problems: DocumentInvalid | None = None

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.problems.diagnostics if self.problems is not None else ()

    @property
    def more(self) -> int:
        return self.problems.more if self.problems is not None else 0


def refused(diagnostics: Iterable[Diagnostic]) -> DocumentInvalid:
    """A document's ``diagnostics`` (each once) as its refusal: in the order of the text, past ``MAX_SHOWN`` counted."""
    shown = sorted(dict.fromkeys(diagnostics), key=Diagnostic.sort_key)
    return DocumentInvalid(shown[:MAX_SHOWN], max(len(shown) - MAX_SHOWN, 0))


def render_problems(diagnostics: Sequence[Diagnostic], more: int = 0, *, hints: bool = True) -> str:
    """Each diagnostic as ``kvpolicy lint`` prints it (with its hint; without ``hints`` on one line
    each), and a last line that counts the ``more`` problems not shown."""
    lines = [d.render() if hints else d.render().split("\n")[0] for d in diagnostics]
    if more:
        lines.append(f"{diagnostics[0].file if diagnostics else ''}: and {more} more problem{'s' if more != 1 else ''}")
    return "\n".join(lines)


class DocumentProblem(ValueError):
    """A problem that a reader's ``convert`` finds in the data of a document (``load_document``), at
    ``path`` of its text (as the user wrote it: ``("gpus", "0")``)."""

    def __init__(self, code: DocumentCode, path: Sequence[object], message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.code, self.path, self.message, self.hint = code, tuple(str(p) for p in path), message, hint


@dataclass(frozen=True)
class DocumentKind:
    """A document a reader expects: its name in messages, its schema's name (``kvpolicy schema NAME``)
    and what the reader takes, in words."""

    ids: frozenset[str]
    """The recognised kinds (``_RECOGNISED``) it takes."""
    name: str
    schema: str
    takes: str


FACTS = DocumentKind(frozenset({"facts", "status"}), "facts", "facts",
                     "facts (kvpolicy schema facts) or a 'kvpolicy status --format json' document")
POLICY_TEST = DocumentKind(frozenset({"kvtest"}), "a policy test", "kvtest", "a policy test (kvpolicy schema kvtest)")
STATE = DocumentKind(frozenset({"state"}), "a rule state", "state",
                     "a rule state (kvpolicy schema state), as the controller's state.json holds")

_RECOGNISED: tuple[tuple[str, str, Callable[[set[str]], bool]], ...] = (
    ("status", "a 'kvpolicy status --format json' document", lambda keys: bool(
        keys & {"written_at", "controller", "last_reload", "problems"})),
    ("kvtest", "a policy test (a .kvtest.json file)", lambda keys: "cases" in keys),
    ("decision", "a decision (what 'kvpolicy explain --format json' prints)", lambda keys: {"policy", "rules"} <= keys
        and bool(keys & {"gpus", "instances"})),
    ("lint", "findings (what 'kvpolicy lint --format json' prints)", lambda keys: "diagnostics" in keys),
    ("error", "an error document (what a command prints with --format json when it fails)", lambda keys: "error" in keys),
    ("facts", "facts", lambda keys: bool(keys & {"gpus", "instances"})),
    ("state", "a rule state (what explain --state and the controller's state.json hold)", lambda keys: "rules" in keys),
)
"""kvpolicy's documents, each by the top-level keys that tell it from the others (in this order)."""


def load_document(model: type[M], text: str, source: object, *, kind: DocumentKind,
                  convert: Callable[[Any], Any] | None = None, locate: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None) -> M:
    """``text`` parsed and validated as ``model`` (a document of ``kind``); ``DocumentInvalid`` with the
    diagnostics of its problems in ``source``. ``convert`` reshapes the parsed data first (a status
    document into facts), and may raise ``DocumentProblem``; ``locate`` maps a path in what it made to
    the path in ``text`` its value came from (by default the same path, or its nearest ancestor)."""
    from pydantic import ValidationError

    file = str(source)
    data = parse_document(text, file)
    try:
        shaped = convert(data) if convert is not None else data
        return model.model_validate(shaped)
    except DocumentProblem as exc:
        place = Places(text).of(exc.path)
        raise DocumentInvalid([exc.code.at(file, *place, exc.message, exc.hint)]) from None
    except ValidationError as exc:
        diagnostics = _refusals(exc, model, data, text, file, kind, locate if shaped is not data else None)
    except RecursionError:  # validating a document nested deeper than parsing it
        raise _too_deep(text, file) from None
    raise refused(diagnostics)


def parse_document(text: str, source: object, *, what: str | None = None) -> Any:
    """``text`` parsed as a document of ``source``; ``DocumentInvalid`` where it is not valid JSON (KVD002), holds
    a number too long (KVD005) or nests past ``MAX_DEPTH`` (KVD004), at the place. ``what`` names the kind of
    file in the hints of the last two ("model config"; None: kvpolicy's own documents)."""
    file = str(source)
    try:
        data = parse_json(text)
    except JsonInvalid as exc:  # one nested too deeply for Python is deeper than MAX_DEPTH too: said so
        if exc.code is NESTED_TOO_DEEPLY:
            raise _too_deep(text, file, what) from None
        hint = _unlike(what, "holds a number this long") if what and exc.code is NUMBER_TOO_LONG else None
        raise DocumentInvalid([exc.diagnostic(file, hint)]) from None
    if _deeper_than(data, MAX_DEPTH):
        raise _too_deep(text, file, what)
    return data


@dataclass(frozen=True)
class JsonObjectFile:
    """A JSON object read from a file people write that kvpolicy has no schema of (a model's ``config.json``),
    with its text: whoever reads its values places the problems it finds at the values they are about."""

    file: str
    text: str
    data: dict[str, Any]

    def diagnostic(self, code: DocumentCode, path: Sequence[object], message: str, hint: str | None = None) -> Diagnostic:
        """``code``'s diagnostic at the value at ``path`` (as the file nests it: ``("text_config", "head_dim")``)
        or its nearest ancestor; for ``MISSING_FIELD`` (``path`` ending with the field) at the ``{`` of the object
        that lacks it."""
        return code.at(self.file, *self._places.place(tuple(path), missing=code is MISSING_FIELD), message, hint)

    def refusal(self, exc: ValidationError, model: type[BaseModel], *,
                locate: Callable[[tuple[str, ...]], tuple[object, ...]] | None = None, hint: str | None = None,
                hint_for: Callable[[Problem], str | None] | None = None) -> DocumentInvalid:
        """The problems of ``exc`` (raised validating ``model`` on data read from this file), each at its place
        (``locate``: the path in the file of a path in that data; None: the same); ``hint_for`` hints a problem
        that has no hint of its own (its answer None: ``hint``)."""
        from kvpolicy.validation import problems

        return refused(_diagnostics(problems(exc, model), self._places, self.file, hint, locate, hint_for))

    @cached_property
    def _places(self) -> Places:
        return Places(self.text)


def read_json_object(path: Path | str, *, what: str) -> JsonObjectFile:
    """The file ``path``, which holds a JSON object (a ``what``: "model config"): ``OSError`` as ``open`` raises
    it; ``DocumentInvalid`` for the problems of its text (KVD001 to KVD005) or a value that is no object (KVD007)."""
    from kvpolicy.validation import shown

    file = str(path)
    text = read_document_text(path, what=what)
    data = parse_document(text, file, what=what)
    if not isinstance(data, dict):
        raise DocumentInvalid([WRONG_TYPE.at(file, *Places(text).of(()), f"(top level): must be an object ({{...}}), not "
                                             f"{shown(data)}", f"a {what} is one JSON object, {{...}}")])
    return JsonObjectFile(file, text, data)


def _refusals(exc: ValidationError, model: type[BaseModel], data: Any, text: str, file: str, kind: DocumentKind,
              locate: Callable[[tuple[str, ...]], tuple[str, ...]] | None) -> list[Diagnostic]:
    """The diagnostics of ``exc``: one for a document of another kind or schema, else one per problem."""
    from kvpolicy.validation import problems

    places = Places(text)
    wrong = wrong_document(exc, data, kind)
    if wrong is not None:
        path, message, hint = wrong
        return [WRONG_DOCUMENT.at(file, *places.of(path), message, hint)]
    return _diagnostics(problems(exc, model), places, file, f"kvpolicy schema {kind.schema} describes every field", locate)


PROBLEM_CODES: dict[str, DocumentCode] = {"wrong-type": WRONG_TYPE, "value-not-allowed": VALUE_NOT_ALLOWED,
                                         "missing-field": MISSING_FIELD, "unknown-key": UNKNOWN_KEY}
"""The code of each kind of problem validation finds (``kvpolicy.validation.ProblemKind``)."""


def _diagnostics(problems: Iterable[Problem], places: Places, file: str, hint: str | None,
                 locate: Callable[[tuple[str, ...]], tuple[object, ...]] | None,
                 hint_for: Callable[[Problem], str | None] | None = None) -> list[Diagnostic]:
    """A diagnostic per problem, at its place (``locate``: the path in the text of a path in what was validated);
    for those without a hint of their own, ``hint_for``'s, else ``hint``."""
    found = []
    for problem in problems:
        path = locate(problem.path) if locate is not None else problem.path
        place = places.place(path, key=problem.is_key, missing=problem.kind == "missing-field")
        given = problem.hint or (hint_for(problem) if hint_for is not None else None) or hint
        found.append(PROBLEM_CODES[problem.kind].at(file, *place, problem.message, given))
    return found


def wrong_document(exc: ValidationError, data: Any, kind: DocumentKind) -> tuple[tuple[str, ...], str, str] | None:
    """(where, message, hint) for a document of another kind than ``kind``, or of a schema version
    ``exc`` says is not this one's; None for a document of ``kind`` with problems."""
    if not isinstance(data, dict):
        return None
    for error in exc.errors():
        given = error.get("input")
        if tuple(error["loc"]) == ("schema",) and error["type"] == "literal_error" and type(given) is int:
            wanted = str((error.get("ctx") or {}).get("expected", "")).strip("'")
            return (("schema",), f"{kind.schema} schema {given} is not supported: this kvpolicy reads schema {wanted}",
                    f"a newer kvpolicy wrote it? use that one, or write schema {wanted} (kvpolicy schema {kind.schema})")
    keys = {str(k) for k in data}
    recognised = next(((ident, words) for ident, words, test in _RECOGNISED if test(keys)), None)
    if recognised is None or recognised[0] in kind.ids:
        return None
    return (), f"this is {recognised[1]}, not {kind.name}", f"expected {kind.takes}"


class Places:
    """Where paths of a document are in its text, read once, when first asked."""

    def __init__(self, text: str) -> None:
        self._text = text

    @cached_property
    def _document(self) -> JsonDocument | None:
        from kvpolicy.json_positions import parse

        return parse(self._text)

    def of(self, path: tuple[object, ...], *, key: bool = False) -> Place:
        """The place of the value at ``path`` (with ``key``: its key's), or of its nearest ancestor."""
        if self._document is None:  # cannot be: the text parsed as JSON; then the start of it
            return (1, 1), (1, 2)
        start, end = self._document.span_of(path, key=key)
        return _line_col(self._text, start), _line_col(self._text, end)

    def place(self, path: tuple[object, ...], *, key: bool = False, missing: bool = False) -> Place:
        """``of(path)``; with ``missing`` (``path`` ends with a field not given): the ``{`` of the object it
        is missing from."""
        if not missing:
            return self.of(path, key=key)
        start, _ = self.of(path[:-1])
        return start, (start[0], start[1] + 1)


def _deeper_than(data: Any, depth: int) -> bool:
    """Whether ``data`` nests lists and objects more than ``depth`` levels deep (a walk of its containers)."""
    level = [data] if isinstance(data, (dict, list)) else []
    for _ in range(depth):
        below: list[Any] = []
        for container in level:
            values = container.values() if isinstance(container, dict) else container
            below.extend(v for v in values if isinstance(v, (dict, list)))
        if not below:
            return False
        level = below
    return True


_DEEP_HINT = "no kvpolicy document nests more than a dozen levels: is it the right file?"


def _unlike(what: str, how: str) -> str:
    """The hint for a file unlike any ``what`` in how it ``how``: probably another file than the one meant."""
    return f"no {what} {how}: is it the right file?"


_TOKENS = re.compile(r'"(?:[^"\\]+|\\.)*"|[\[\]{}]')


def _too_deep_at(text: str, depth: int = MAX_DEPTH) -> int:
    """The offset of the ``[`` or ``{`` that opens level ``depth + 1`` (0 if none does)."""
    level = 0
    for token in _TOKENS.finditer(text):
        char = token.group()[0]
        if char in "[{":
            level += 1
            if level > depth:
                return token.start()
        elif char in "]}":
            level -= 1
    return 0


def _too_deep(text: str, file: str, what: str | None = None) -> DocumentInvalid:
    start = _line_col(text, _too_deep_at(text))
    hint = _unlike(what, "nests more than a dozen levels") if what else _DEEP_HINT
    return DocumentInvalid([NESTED_TOO_DEEPLY.at(file, start, (start[0], start[1] + 1),
                                                 f"nested more than {MAX_DEPTH} levels deep", hint)])


def _number_too_long(text: str) -> JsonInvalid:
    """The problem of ``text`` that ``json.loads`` refused for an integer of too many digits, at the integer."""
    limit = sys.get_int_max_str_digits()
    # an integer: not a fraction's or an exponent's digits (a float has no limit)
    numbers = re.compile(r'"(?:[^"\\]+|\\.)*"|(?<![\d.eE+-])-?\d{' + str(limit + 1) + r',}(?![.\deE])')
    found = next((m for m in numbers.finditer(text) if not m.group().startswith('"')), None)
    problem = f"a number with more than {limit} digits"
    hint = 'sizes are bytes (at most 2^60) or a string with a unit, such as "40 GiB"'
    if found is None:
        return JsonInvalid(problem, code=NUMBER_TOO_LONG, hint=hint)
    return JsonInvalid(problem, code=NUMBER_TOO_LONG, start=_line_col(text, found.start()), end=_line_col(text, found.end()),
                       hint=hint)


def _syntax_hint(exc: json.JSONDecodeError, text: str) -> str | None:
    """What the common causes of JSON's syntax errors look like, named where one is the cause."""
    at = text[exc.pos:exc.pos + 1]
    before = text[:exc.pos].rstrip()
    if not text.strip():
        return "the file is empty: write a JSON object, {...}"
    if exc.msg.startswith("Unexpected UTF-8 BOM"):
        return "save the file as UTF-8 without a byte order mark"
    if exc.msg == "Extra data":
        return "the document ended before this: a file holds one JSON value"
    if exc.msg.startswith("Invalid control character"):
        return "a string cannot hold a line break or a tab as it is: write \\n or \\t"
    if exc.msg.startswith("Unterminated string"):
        return 'the string has no closing "'
    if at == "'":
        return 'JSON writes strings and keys in double quotes: "..."'
    if at in ("/", "#"):
        return "JSON has no comments"
    if at in ("]", "}") and before.endswith(","):
        return "JSON allows no comma before ] or }"
    if exc.msg == "Expecting value" and text.startswith(("True", "False", "None"), exc.pos):
        return "JSON writes true, false and null in lower case"
    if exc.msg == "Expecting value" and exc.pos >= len(before) and not text[exc.pos:].strip():
        return "the document ends early: is a value or a closing ] or } missing?"
    if exc.msg.startswith("Expecting property name") and (at.isalpha() or at == "_"):
        return 'JSON writes keys in double quotes: "name"'
    if exc.msg == "Expecting ',' delimiter":
        return "a comma is missing before this, or a closing ] or } before it"
    if exc.msg == "Expecting value":
        return 'a value goes here: a number, "a string", true, false, null, [...] or {...}'
    return None


def _line_col(text: str, offset: int) -> tuple[int, int]:
    from kvpolicy.json_positions import line_col

    return line_col(text, offset)
