"""The error codes of the JSON documents people write (the base layer): facts files, policy tests
(``*.kvtest.json``), ``--state`` files, the controller's ``state.json``, and a model's ``config.json``
as ``kvpolicy plan --model-config`` reads it.

Each code is stable (``KVD001``), with a kebab-case name and its documentation: a one-sentence
summary, then the sections *What it covers* and *Fix*, and an example document with what kvpolicy
prints for it (the tests run every example, with the command it names), from which ``docs/document-errors.md`` is generated
(``python -m kvpolicy.document_codes``; ``--check`` says whether it is stale). ``KVD`` keeps them
apart from the policy language's ``KVnnn`` (``kvpolicy.catalogue``): a document error is always an
error, and no comment can silence it. Codes are never reused: a code that goes stays retired.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from kvpolicy import generated
from kvpolicy.diagnostics import Diagnostic, DocumentedCode, Severity
from kvpolicy.paths import MAX_INPUT_BYTES
from kvpolicy.units import MiB

MAX_DEPTH = 32
"""The deepest a document may nest lists and objects: a policy test, the deepest kvpolicy reads,
nests a dozen levels; far deeper is no document of kvpolicy's, and Python's JSON reader would give up
near a thousand."""
MAX_SHOWN = 10
"""The most problems of one document shown; the rest are counted ("and 3 more problems")."""
_DIGITS: int = getattr(sys.int_info, "default_max_str_digits", 4300)  # 3.10 has it from 3.10.7
"""Python's limit on an integer's digits as it ships (``PYTHONINTMAXSTRDIGITS`` may change it): the
reference says this one, whatever the limit where it is generated."""

DOC_SECTIONS = ("What it covers", "Fix")
DEFAULT_EXAMPLE_COMMAND = "kvpolicy explain POLICY --facts facts.json"
_CODE = re.compile(r"KVD\d{3}")
_NAME = re.compile(r"[a-z]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class DocumentCode(DocumentedCode):
    """One kind of problem a document can have: its identity and its documentation."""

    code: str
    name: str
    doc: str
    """The summary sentence, a blank line, then ``## What it covers`` and ``## Fix``."""
    example: str | bytes | None = None
    """A document that has this problem, ``example_file`` (None: one too large to show)."""
    output: str | None = None
    """What ``example_command`` prints for ``example`` (the tests check it)."""
    example_file: str = "facts.json"
    example_command: str = DEFAULT_EXAMPLE_COMMAND
    """The command that reports the example (``POLICY``: a policy of the repository's)."""

    def __post_init__(self) -> None:
        if not _CODE.fullmatch(self.code):
            raise ValueError(f"document code {self.code!r} is not KVDnnn")
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"document code name {self.name!r} is not kebab-case")
        if (self.example is None) != (self.output is None):
            raise ValueError(f"{self.code}: an example needs its output, and an output its example")

    def at(self, file: str, start: tuple[int, int], end: tuple[int, int], message: str,
           hint: str | None = None) -> Diagnostic:
        """An error of this code in ``file`` from ``start`` to ``end`` (1-based line and column, end exclusive)."""
        return Diagnostic(file=file, line=start[0], col=start[1], end_line=end[0], end_col=end[1], code=self.code,
                          name=self.name, severity=Severity.ERROR, message=message, hint=hint)


_DEFINED: list[DocumentCode] = []


def _define(code: str, name: str, doc: str, example: str | bytes | None = None, output: str | None = None,
            **where: str) -> DocumentCode:
    """A code, with ``where``: the ``example_file`` and ``example_command`` of an example that is not facts."""
    defined = DocumentCode(code, name, inspect.cleandoc(doc), example, inspect.cleandoc(output) if output else None,
                           **where)
    _DEFINED.append(defined)
    return defined


# ---- reading the text -----------------------------------------------------------------------

NOT_UTF8 = _define(
    "KVD001", "not-utf8",
    """
    A document whose bytes are not UTF-8.

    ## What it covers
    JSON documents are UTF-8 text. The place is the first byte that is not: its line, and its
    column counted in the characters before it; the message shows the byte. The controller's
    `state.json` is checked the same way.

    ## Fix
    Save the file as UTF-8 (an editor's encoding setting, or `iconv -t UTF-8`). A name written in
    another encoding is the usual cause.
    """,
    b'{"schema": 1, "gpus": [{"id": "cuda:\xff0", "capacity": "80 GiB"}]}\n',
    """
    facts.json:1:37: KVD001 error: not UTF-8 (byte 0xff)
      hint: save the file as UTF-8
    """,
)
JSON_SYNTAX = _define(
    "KVD002", "json-syntax",
    """
    A document that is not valid JSON.

    ## What it covers
    The message is JSON's own (Python's reader's words), at the place it stopped. Where the cause is
    a common one, the hint names it: a comma before `]` or `}`, single quotes, a key without quotes,
    a comment, `True` for `true`, a line break inside a string, a byte order mark, an empty file.

    ## Fix
    Correct the text at the place named; `python3 -m json.tool FILE` checks a file alone.
    """,
    '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": "80 GiB"},]}\n',
    """
    facts.json:2:50: KVD002 error: not valid JSON: Expecting value
      hint: JSON allows no comma before ] or }
    """,
)
DOCUMENT_TOO_LARGE = _define(
    "KVD003", "document-too-large",
    f"""
    A document larger than {MAX_INPUT_BYTES // MiB} MiB.

    ## What it covers
    Facts, policy tests, `--state` files and model configs are read to {MAX_INPUT_BYTES // MiB} MiB and no further:
    thousands of instances fit in a few MiB, and reading without a bound (`--facts /dev/zero`) would
    exhaust memory before any check could refuse it. The place is where the limit falls.

    ## Fix
    Check that it is the right file. Facts for a whole node are far smaller.
    """,
)
NESTED_TOO_DEEPLY = _define(
    "KVD004", "nested-too-deeply",
    f"""
    A document that nests lists and objects more than {MAX_DEPTH} levels deep.

    ## What it covers
    No kvpolicy document nests more than a dozen levels; a deeper one is another kind of file, or
    generated by mistake. The place is the `[` or `{{` that opens level {MAX_DEPTH + 1}.

    ## Fix
    Check that it is the right file, and remove the extra levels.
    """,
    '{"schema": 1, "gpus": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}\n",
    """
    facts.json:1:54: KVD004 error: nested more than 32 levels deep
      hint: no kvpolicy document nests more than a dozen levels: is it the right file?
    """,
)
NUMBER_TOO_LONG = _define(
    "KVD005", "number-too-long",
    f"""
    A document with an integer of more digits than Python converts ({_DIGITS}).

    ## What it covers
    Python refuses to convert an integer of more than {_DIGITS} digits (its `int_max_str_digits`,
    unless `PYTHONINTMAXSTRDIGITS` sets another): the work grows with the square of the digits.
    The place is the number; a fraction's or an exponent's digits have no limit.

    ## Fix
    Write the figure it should be: sizes are bytes, at most 2^60, or a string with a unit
    (`"40 GiB"`).
    """,
)

# ---- the document -------------------------------------------------------------------------------

WRONG_DOCUMENT = _define(
    "KVD006", "wrong-document",
    """
    A document of another kind, or of a schema version this kvpolicy does not read.

    ## What it covers
    A document that is recognisably another of kvpolicy's (a decision, `kvpolicy explain --format
    json`'s output, given as facts; facts given as `--state` or as a policy test's inline `state`;
    lint findings; an error document) is named as what it is, at its start, instead of every
    field it has that the expected one has not. A `schema` other than the one this kvpolicy reads
    is named at its value: the rest of a document of another version is not checked. (`--facts`
    takes a `kvpolicy status --format json` document as well as facts.)

    ## Fix
    Give the document the option expects (`kvpolicy schema facts`, `kvtest` and `state` print the
    schemas). For a newer schema, use the kvpolicy that wrote it.
    """,
    '{"schema": 1, "rules": {"idle-reclaim": {}}}\n',
    """
    facts.json:1:1: KVD006 error: this is a rule state (what explain --state and the controller's state.json hold), not facts
      hint: expected facts (kvpolicy schema facts) or a 'kvpolicy status --format json' document
    """,
)
WRONG_TYPE = _define(
    "KVD007", "wrong-type",
    """
    A value of the wrong kind: a string where a number goes, a list where an object goes.

    ## What it covers
    The message names the value by its path (`gpus.0.id`, lists counted from 0; `(top level)`
    for the document itself), what it must be in JSON's words (a string, a whole number, an
    object, a list, true or false) and what was written; the place is the value. The hint says
    what the field is (its description in the schema).

    ## Fix
    Write a value of the kind named. `kvpolicy schema facts` (or `kvtest`, `state`) describes every
    field.
    """,
    '{"schema": 1,\n "gpus": [{"id": 0, "capacity": "80 GiB"}]}\n',
    """
    facts.json:2:18: KVD007 error: gpus.0.id: must be a string, not 0
      hint: id: The GPU's id, as instances name it: its UUID (GPU-... or MIG-...), or cuda:N where NVML is missing.
    """,
)
VALUE_NOT_ALLOWED = _define(
    "KVD008", "value-not-allowed",
    """
    A value of the right kind that is out of range or not one of those allowed.

    ## What it covers
    A negative size, a size without a unit (`"80"`), a choice that is not one of the choices, a
    number that is not finite (`NaN`, `1e400`), and a value that disagrees with the rest of the
    document: an id an earlier GPU or instance has (placed at the later one), an instance on a GPU
    the facts do not list (placed at its `gpu`), an id a policy test's `set` or `remove` names that
    its case's facts lack (placed at that id), a case's facts file that cannot be read (at its
    path). The message shows what was written; the place is the value.

    ## Fix
    Write a value in range: the message says which.
    """,
    '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": -5}]}\n',
    """
    facts.json:2:40: KVD008 error: gpus.0.capacity: must be 0 or more, not -5
      hint: capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity).
    """,
)
MISSING_FIELD = _define(
    "KVD009", "missing-field",
    """
    A required field that is not given.

    ## What it covers
    The place is the object that lacks it (its `{`); the hint says what the field is. A
    `kvpolicy status --format json` document given as facts has it for a GPU whose figures no
    controller published (its `capacity` is null).

    ## Fix
    Add the field to that object.
    """,
    '{"schema": 1,\n "gpus": [{"id": "cuda:0"}]}\n',
    """
    facts.json:2:11: KVD009 error: gpus.0.capacity: required, not given
      hint: capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity).
    """,
)
UNKNOWN_KEY = _define(
    "KVD010", "unknown-key",
    """
    A key that the object it is in does not have.

    ## What it covers
    Documents people write refuse unknown keys, so that a typo cannot silently fall back to a
    default. The place is the key; the hint is the field it was probably meant to be, or the
    fields the object has.

    ## Fix
    Correct the key, or remove it.
    """,
    '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capcity": "80 GiB"}]}\n',
    """
    facts.json:2:11: KVD009 error: gpus.0.capacity: required, not given
      hint: capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity).
    facts.json:2:28: KVD010 error: gpus.0.capcity: unknown field 'capcity'
      hint: did you mean 'capacity'?
    """,
)


# ---- a model config with the launch's flags -----------------------------------------------------

LAUNCH_REFUSED = _define(
    "KVD011", "launch-refused",
    """
    A value of a model config that the engine refuses with the flags of the launch.

    ## What it covers
    `kvpolicy plan --model-config` refuses what the engine would refuse at start-up, in the
    engine's words, placed at the value of the config that the flags do not fit: a
    `--tensor-parallel-size` that does not divide the attention heads, the KV heads, the vocabulary
    or an MLP's width; a `--max-model-len` past the length the config gives; `--dtype float16` for
    a model type vLLM refuses it for; a 16-bit `--kv-cache-dtype` other than the config's dtype;
    `--kv-cache-dtype fp8_e5m2` with a checkpoint whose attention loads fp8 KV scales (placed at its
    `quantization_config`), and a KV dtype the checkpoint's quantization config gives that the
    attention backends refuse; an MXFP4 indexer with `index_head_dim` 512. A value the file does not
    set (its config class's default) is placed at `model_type`, and the message says so. A value the
    engine refuses whatever the flags (attention heads that are not a multiple of the KV heads) is
    KVD008; a flag refused on its own is no problem of the config, and is reported without a place
    or code.

    ## Fix
    Change the flag as the message says, or the value of the config if it is the one that is wrong.
    """,
    '{"model_type": "qwen3",\n "num_attention_heads": 32, "num_key_value_heads": 8}\n',
    """
    config.json:2:25: KVD011 error: --tensor-parallel-size 3 does not divide the model's 32 attention heads, and vLLM refuses it at start-up; use a size that divides 32 (up to 16: 1, 2, 4, 8, 16)
    """,
    example_file="config.json",
    example_command="kvpolicy plan --engine vllm --model-config config.json --budget 40GiB --tensor-parallel-size 3",
)

CODES: tuple[DocumentCode, ...] = tuple(_DEFINED)
"""Every document code, by code."""


def _check(codes: Sequence[DocumentCode]) -> None:
    seen: set[str] = set()
    for code in codes:
        if code.code in seen or code.name in seen:
            raise ValueError(f"{code.code} {code.name}: the code or the name is already taken")
        if tuple(code.sections()) != DOC_SECTIONS:
            raise ValueError(f"{code.code}: its documentation's sections are not {DOC_SECTIONS}")
        seen |= {code.code, code.name}


_check(CODES)


# ---- the reference, docs/document-errors.md ----------------------------------------------------

DEFAULT_PATH = generated.REPOSITORY / "docs" / "document-errors.md"


def render() -> str:
    """The whole of ``docs/document-errors.md``."""
    out = [
        "# Errors in JSON documents",
        "",
        "<!-- Generated by `python -m kvpolicy.document_codes` from kvpolicy/document_codes.py.",
        "     Do not edit by hand: a test fails when this file is stale. -->",
        "",
        "The JSON documents people write are checked as they are read: facts (`kvpolicy explain",
        "--facts`, `diff`, `lint --facts`, `run --facts`, a policy test's facts files), policy tests",
        "(`kvpolicy test`, `*.kvtest.json`), `explain --state`, the rules' memory the controller keeps",
        "beside the ledger (`state.json`, read at start and by `explain --live`), and a model's",
        "`config.json` as `kvpolicy plan --model-config` reads it. Each problem is reported as the",
        "policy language's are ([lint-rules.md](lint-rules.md)), at the place of the text it is about:",
        "",
        "```text",
        "facts.json:2:40: KVD008 error: gpus.0.capacity: must be 0 or more, not -5",
        "  hint: capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity).",
        "```",
        "",
        "Lines and columns count from 1, columns in characters. Every problem of a document is",
        f"reported, each at its own place, in the order of the text: the first {MAX_SHOWN}, then a line",
        "that counts the rest (`facts.json: and 4 more problems`). The command exits 1 (2 when the file",
        "cannot be read at all: missing, a directory, no permission). With `--format json` the error",
        "document carries them as `lint`'s diagnostics ([json.md](json.md)). The controller refuses to",
        "start on `--facts` with problems, and starts with no rule memory, logging the problems, when",
        "its `state.json` has them.",
        "",
        "A model config has no schema of kvpolicy's: its text is checked as any document's (KVD001 to",
        "KVD005, and KVD007 for one that is not a JSON object), and each value `plan` cannot use is",
        "placed at that value, in the plan's words (KVD007 to KVD009, KVD011): a key read from a",
        "multimodal config's `text_config` inside it; a value the file does not set, its config class's",
        "default, at `model_type` (the message says so). A vLLM plan stops at the first value it",
        "cannot use, as vLLM would; an SGLang plan reports each field of the DeepSeek-V4 geometry it",
        "cannot use.",
        "",
        "The codes are `KVD` and three digits, apart from the policy language's `KV` codes; a code",
        "keeps its meaning, and one that goes is never reused. The examples are facts files, as",
        "`kvpolicy explain POLICY --facts facts.json` reports them on standard error, but where an",
        "example names another file and command; the tests run them.",
        "",
        "| Code | Name | What it reports |",
        "|---|---|---|",
    ]
    out += [f"| [{c.code}](#{c.anchor()}) | `{c.name}` | {c.summary()} |" for c in CODES]
    for code in CODES:
        out += ["", *_section(code)]
    return "\n".join(out) + "\n"


def _section(code: DocumentCode) -> list[str]:
    sections = code.sections()
    lines = [f"## {code.code} {code.name}", "", code.summary(), "", "### What it covers", "", sections["What it covers"]]
    if code.example is not None and code.output is not None:
        if isinstance(code.example, bytes):
            shown, words = code.example.decode("utf-8", errors="backslashreplace"), " (bytes that are not UTF-8 as `\\xNN`)"
        else:
            shown, words = code.example, ""
        by = "" if code.example_command == DEFAULT_EXAMPLE_COMMAND else f" by `{code.example_command}`"
        lines += ["", "### Example", "", f"`{code.example_file}`{words}:", "", "```json", shown.rstrip("\n"), "```",
                  "", f"is reported{by} as", "", "```text", code.output, "```"]
    lines += ["", "### Fix", "", sections["Fix"]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return generated.main("kvpolicy.document_codes", __doc__, lambda: {DEFAULT_PATH: render()}, argv)


if __name__ == "__main__":
    sys.exit(main())
