"""The editor's incremental lint (``StatementCache``) is a lint from scratch, field by field.

Random edit sequences on generated policies: after each edit, the lint that reuses
what the last version built equals ``lint_text`` of the whole text (diagnostics,
policy, partial policy), the cache answers exactly when the text has no syntax
error, and the comments it keeps stand where a full parse puts them. Then: an edit
of one statement re-parses that statement alone.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.diagnostics import Span
from kvpolicy.lint.engine import LintResult, lint_text
from kvpolicy.policy import incremental
from kvpolicy.policy.incremental import StatementCache, split
from kvpolicy.policy.syntax import parse_tree

from .helpers import PROFILE, examples
from .strategies import valid_policies

FILE = "edited.kvp"

FRAGMENTS = st.sampled_from([
    "\n", "\n\n", "}", "{", "}\n", '"', "#", "# note\n", "(", ")", ";", ",", " ", "GiBB", " 4 GiB", "5", "-", "%",
    "version 1\n", "version 2\n", 'model "extra*" { priority 7; reserve 1 GB }\n', "pool swa { owner runtime }\n",
    "  reserve 2 GiB\n", "  max 120%\n", "  priority 5000\n", "  enigne vllm\n", "  engine sglang\n",
    'rule "r" {\n  when (gpu.free < 1 GiB\n    or model.idle > 60s)\n  shrink to min\n}\n',
    "# kvpolicy: ignore[KV019] vendor sizes\n", " # kvpolicy: ignore[KV019]", "# kvpolicy: ignore[KV999] x\n",
    "  when not not gpu.free < 1 GiB\n", "model", "rule", "gpu * { capacity 80 GiB }\n",
])


@st.composite
def edits(draw) -> tuple[str, list[tuple[int, int, str]]]:
    """A valid policy and 1-6 edits, each (start, length deleted, text inserted) as fractions of the text."""
    text = draw(valid_policies())
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["insert", "insert", "delete", "replace", "line"]))
        where = draw(st.integers(0, 1000))
        length = 0 if kind == "insert" else draw(st.integers(1, 40))
        inserted = "" if kind == "delete" else draw(FRAGMENTS)
        steps.append((where, length if kind != "line" else -1, inserted))
    return text, steps


def _apply(text: str, where: int, length: int, inserted: str) -> str:
    """One edit; ``length`` -1 duplicates the line at ``where`` (a statement copied, lines shift)."""
    at = where * len(text) // 1000
    if length == -1:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        line = text[start:] if end < 0 else text[start : end + 1]
        return text[:start] + line + ("\n" if end < 0 else "") + text[start:]
    return text[:at] + inserted + text[at + length :]


def _positions(tokens) -> list[tuple]:
    return [(t.type, t.value, t.start_pos, t.end_pos, t.line, t.column, t.end_line, t.end_column) for t in tokens]


def _same(incremental_result: LintResult, full: LintResult) -> None:
    assert [d.model_dump() for d in incremental_result.diagnostics] == [d.model_dump() for d in full.diagnostics]
    assert incremental_result.policy == full.policy
    assert incremental_result.partial == full.partial
    assert (incremental_result.file, incremental_result.text) == (full.file, full.text)


@settings(PROFILE, max_examples=examples(60))
@given(edits())
def test_incremental_lint_equals_a_full_lint_after_every_edit(case: tuple[str, list[tuple[int, int, str]]]) -> None:
    text, steps = case
    linting, probing = StatementCache(), StatementCache()
    _same(lint_text(text, FILE, statements=linting), lint_text(text, FILE))
    for where, length, inserted in steps:
        text = _apply(text, where, length, inserted)
        assert "".join(chunk.text for chunk in split(text)) == text
        full = lint_text(text, FILE)
        _same(lint_text(text, FILE, statements=linting), full)
        # the cache builds exactly the texts that parse, and keeps their comments where they are
        lines = text.split("\n")
        syntax = parse_tree(text, FILE)
        built = probing.build(text, FILE, hashlib.sha256(text.encode()).hexdigest(), Span.point(len(lines), len(lines[-1]) + 1))
        assert (built is None) == bool(syntax.diagnostics)
        if built is not None:
            assert _positions(built.comments) == _positions(syntax.comments)


POLICY = """version 1  # the language
# a family of models
model "a*" {
  reserve 4 GB  # kvpolicy: ignore[KV019] the vendor's sizes
}

model "b" { priority 5; reserve 2 GiB }  # one line

rule "reclaim" {
  when (gpu.free < 2 GiB
        or model.idle > 60s)
  shrink to min
  grace 10s
}
"""


def test_split_cuts_after_each_top_level_statement() -> None:
    chunks = split(POLICY)
    assert [c.first_line for c in chunks] == [1, 2, 6, 8]
    assert [c.offset for c in chunks] == [POLICY.index(c.text) for c in chunks]
    assert "".join(c.text for c in chunks) == POLICY


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the statement cache hands to the parser, in order."""
    texts: list[str] = []
    parse = incremental.parse

    def spy(text, trace):
        texts.append(text)
        return parse(text, trace)

    monkeypatch.setattr(incremental, "parse", spy)
    return texts


def test_an_edit_reparses_only_its_statement(parsed: list[str]) -> None:
    cache = StatementCache()
    first = lint_text(POLICY, FILE, statements=cache)
    assert parsed == [POLICY]  # the first version: one parse of the whole
    assert [d.code for d in first.diagnostics] == []  # the suppression holds

    edited = POLICY.replace("priority 5", "priority 5000")
    parsed.clear()
    again = lint_text(edited, FILE, statements=cache)
    assert parsed == ['\nmodel "b" { priority 5000; reserve 2 GiB }  # one line\n']  # the one statement that changed
    assert [(d.code, d.line) for d in again.diagnostics] == [("KV014", 7)]
    assert again == lint_text(edited, FILE)

    broken = edited.replace("shrink to min", "shrink to {")  # a syntax error: then the whole text is parsed
    parsed.clear()
    result = lint_text(broken, FILE, statements=cache)
    assert parsed == [broken[broken.index('\nrule "reclaim"'):]]
    assert result == lint_text(broken, FILE) and result.errors
    parsed.clear()
    assert lint_text(edited, FILE, statements=cache) == again  # the cache still holds the version before
    assert parsed == []


def test_a_line_added_moves_the_statements_below_without_parsing_them(parsed: list[str]) -> None:
    cache = StatementCache()
    lint_text(POLICY, FILE, statements=cache)
    moved = POLICY.replace("# a family of models\n", "# a family of models\n\n")
    parsed.clear()
    result = lint_text(moved, FILE, statements=cache)
    assert parsed == ['# a family of models\n\nmodel "a*" {\n  reserve 4 GB  # kvpolicy: ignore[KV019] the vendor\'s sizes\n}\n']
    assert result == lint_text(moved, FILE)
    assert result.policy is not None and result.policy.rules[0].span.line == 10  # one line further down

    # a statement whose building reported something is built again where it now stands:
    # its message names a line
    twice = moved.replace("priority 5;", "priority 5; priority 6;")
    lint_text(twice, FILE, statements=cache)
    below = twice.replace('model "a*" {\n', 'model "a*" {\n\n')
    parsed.clear()
    result = lint_text(below, FILE, statements=cache)
    # the statement edited, and the one below it (parsed with it, as adjacent); not the rule
    assert parsed == [below[below.index("# a family"):below.index('\nrule "reclaim"')]]
    assert [(d.code, d.line, d.hint) for d in result.diagnostics] == [("KV011", 9, "remove one (the first is on line 9)")]
    assert result == lint_text(below, FILE)
