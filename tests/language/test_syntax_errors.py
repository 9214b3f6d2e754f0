"""Syntax errors: every kind has examples that produce exactly it, and no message
ever shows the grammar's insides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpolicy.lint.engine import lint_text
from kvpolicy.policy.lark_parser import parser
from kvpolicy.policy.syntax import MAX_ERRORS, parse_tree
from kvpolicy.policy.syntax_messages import ERROR_EXAMPLES, MATCHERS, describe

from .helpers import TERMINAL_NAMES, shows_terminal_name

EXAMPLES = [(kind, i, text) for kind, texts in ERROR_EXAMPLES.items() for i, text in enumerate(texts)]
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "lint"


@pytest.mark.parametrize(("kind", "index", "text"), EXAMPLES, ids=[f"{k}-{i}" for k, i, _ in EXAMPLES])
def test_example_produces_exactly_its_kind(kind: str, index: int, text: str) -> None:
    result = parse_tree(text, "p.kvp")
    assert result.kinds == [kind], [d.render() for d in result.diagnostics]
    for d in result.diagnostics:
        assert not shows_terminal_name(d.message + " " + (d.hint or "")), d.render()


def test_every_matcher_has_examples_and_a_kind_of_its_own() -> None:
    """A kind names one matcher, so an example that yields the kind was explained by it."""
    kinds = [m.kind for m in MATCHERS]
    assert len(kinds) == len(set(kinds))
    assert [m.kind for m in MATCHERS if not m.examples] == []
    assert set(ERROR_EXAMPLES) == set(kinds)


def test_the_last_matcher_of_each_error_takes_any() -> None:
    for error in {m.error for m in MATCHERS}:
        last = [m for m in MATCHERS if m.error is error][-1]
        assert last.applies(None), f"{error.__name__}: no matcher takes what the others leave"


def test_no_terminal_name_in_golden_outputs() -> None:
    for out in sorted(GOLDEN.glob("*.out")):
        for line in out.read_text(encoding="utf-8").splitlines():
            if re.match(r"\S+:\d+:\d+: KV\d{3} ", line) or line.startswith("  hint: "):
                assert not shows_terminal_name(line), f"{out.name}: {line}"


def test_every_terminal_has_words() -> None:
    """Whatever the parser expects, the message names it in the language's words."""
    for terminal in parser().terminals:
        words = describe({terminal.name}, None)
        assert words != "something else", terminal.name
        assert not TERMINAL_NAMES.search(words), (terminal.name, words)


@pytest.mark.parametrize(
    ("text", "line", "col", "message"),
    [
        # a missing value: right after the keyword that needs it
        ('version 1\nmodel "a" {\n  priority\n}\n', 3, 11, "'priority' needs a number"),
        ("version\n", 1, 8, "'version' needs a version number"),
        ('version 1\nrule "r" {\n  when gpu.free <\n}\n', 3, 18, "missing a value after '<'"),
        ('version 1\nrule "r" { shrink to }\n', 2, 21, "'shrink to' needs min, target, a size or a percentage"),
        # a missing brace: where it belongs
        ('version 1\nmodel "a" {\n  reserve 1 GiB\n\nrule "r" {\n  when gpu.free < 1 GiB\n  shrink to min\n}\n', 5, 1, "missing '}' before line 5"),
        ('version 1\nmodel "a" {\n  reserve 1 GiB\n', 4, 1, "missing '}' at the end of the file"),
        ('version 1\nmodel "a"\n  reserve 1 GiB\n}\n', 2, 10, "expected '{' to open the model block"),
        # a missing parenthesis: after the condition it should close
        ('version 1\nrule "r" {\n  when (gpu.free < 1 GiB\n  shrink to min\n}\n', 3, 25, "missing ')'"),
    ],
)
def test_position_of_what_is_missing(text: str, line: int, col: int, message: str) -> None:
    diagnostics = lint_text(text, "p.kvp").diagnostics
    assert diagnostics, "no error"
    first = diagnostics[0]
    assert ((first.line, first.col), message) == ((line, col), first.message[: len(message)]), first.render()


def test_several_errors_in_one_run() -> None:
    text = 'version 1\nmodel "a" {\n  priority\n}\nmodel b {\n}\nrule "r" {\n  shrink min\n}\n'
    result = parse_tree(text, "p.kvp")
    assert [d.line for d in result.diagnostics] == [3, 5, 8]
    assert result.kinds == ["missing-value", "unquoted-name", "missing-to"]


def test_errors_are_capped() -> None:
    text = "version 1\n" + 'model "a" { priority }\n' * 100
    result = parse_tree(text, "p.kvp")
    assert len(result.diagnostics) == MAX_ERRORS
