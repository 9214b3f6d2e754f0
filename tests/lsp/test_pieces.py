"""The language server's parts that need no client: what hover and highlighting say about
the language must be what the grammar and the reference say; edits and positions are exact."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from lark import Lark

from kvpolicy.lsp import reference
from kvpolicy.lsp.actions import apply
from kvpolicy.lsp.formatting import line_edits
from kvpolicy.json_positions import parse
from kvpolicy.lsp.positions import Codec, Pos
from kvpolicy.lsp.scan import scan
from kvpolicy.units import DURATION_UNITS, SIZE_UNITS
from tests.language.helpers import PROFILE, examples

ROOT = Path(__file__).resolve().parents[2]
TEXTMATE = ROOT / "editors" / "vscode" / "syntaxes" / "kvpolicy.tmLanguage.json"


def lark_keywords() -> set[str]:
    """The grammar's keywords: its string terminals that are words."""
    parser = Lark((ROOT / "grammar" / "kvpolicy.lark").read_text(encoding="utf-8"), parser="lalr")
    return {t.pattern.value for t in parser.terminals if t.pattern.type == "str" and re.fullmatch(r"[a-z_]+", t.pattern.value)}


def test_lark_keywords_are_what_they_seem() -> None:
    assert {"version", "model", "rule", "shrink", "to", "and", "or", "not"} <= lark_keywords()
    assert "runtime" not in lark_keywords()  # an owner is a name, not a keyword


def test_every_keyword_has_its_reference_line() -> None:
    missing = sorted(w for w in lark_keywords() if not reference.entries_for(w))
    assert missing == []


def test_every_attribute_has_its_reference_line() -> None:
    from kvpolicy.policy.vocabulary import ATTRIBUTES

    assert sorted(a for a in ATTRIBUTES if not reference.entries_for(a)) == []


def test_the_reference_table_is_fresh() -> None:
    """kvpolicy/lsp/reference_table.py is what docs/language.md says today."""
    assert reference.main(["--check"]) == 0, "run: python -m kvpolicy.lsp.reference"


def test_a_reference_line_is_the_docs_own_line() -> None:
    doc = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    for entry in reference.entries():
        assert entry.row in doc.split("\n"), entry


def textmate() -> dict:
    return json.loads(TEXTMATE.read_text(encoding="utf-8"))


def test_textmate_keywords_are_the_grammars() -> None:
    pattern = textmate()["repository"]["keyword"]["match"]
    alternation = re.fullmatch(r"\\b\(\?:([a-z_|]+)\)\\b", pattern)
    assert alternation is not None, pattern
    assert set(alternation.group(1).split("|")) == lark_keywords()


def test_textmate_units_are_the_languages() -> None:
    pattern = textmate()["repository"]["quantity"]["match"]
    units = re.search(r"\(\?:([A-Za-z|]+)\)\(\?!", pattern)
    assert units is not None, pattern
    assert set(units.group(1).split("|")) == set(SIZE_UNITS) | set(DURATION_UNITS)


def test_textmate_patterns_highlight_a_policy() -> None:
    """The patterns are also valid Python regexes (no Oniguruma-only syntax): check what they match."""
    repo = textmate()["repository"]
    keyword = re.compile(repo["keyword"]["match"])
    quantity = re.compile(repo["quantity"]["match"])
    assert [m.group() for m in keyword.finditer('model "m" { reserve 4 GiB; pool c4 { owner runtime } } modeling')] == [
        "model", "reserve", "pool", "owner",
    ]
    assert [m.groups() for m in quantity.finditer("reserve 40 GiB; max 50%; grace 30s; c4 1.5 MiB")] == [
        ("40", "GiB"), ("50", "%"), ("30", "s"), ("1.5", "MiB"),
    ]


texts = st.lists(st.sampled_from(["a", "b", "", "c c", "  d", "\t"]), max_size=10).map("\n".join) | st.text(alphabet="ab\n ", max_size=30)


@settings(PROFILE, max_examples=examples(400))
@given(texts, texts)
def test_line_edits_turn_the_old_text_into_the_new(old: str, new: str) -> None:
    edits = line_edits(old, new)
    assert apply(old, tuple(edits)) == new
    assert (edits == []) == (old == new)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)


@settings(PROFILE, max_examples=examples(300))
@given(json_values, st.sampled_from([None, 1, 2]))
def test_json_with_positions_reads_what_json_reads(value: object, indent: int | None) -> None:
    text = json.dumps(value, indent=indent)
    document = parse(text)
    assert document is not None and document.value == value
    for s in document.strings:
        assert json.loads(text[s.start : s.end]) == s.value


def test_json_paths_and_malformed_text() -> None:
    text = '{"cases": [{"expect": {"instances": {"chat/0": {"actions": ["idle"]}}}}]}'
    document = parse(text)
    assert document is not None
    by_value = {s.value: (s.path, s.is_key) for s in document.strings}
    assert by_value["chat/0"] == (("cases", 0, "expect", "instances", "chat/0"), True)
    assert by_value["idle"] == (("cases", 0, "expect", "instances", "chat/0", "actions", 0), False)
    assert parse('{"cases": [') is None
    assert parse('{"a": 1} x') is None


def test_codec_counts_utf16_and_utf8_units() -> None:
    text = 'model "\U0001F600é" { x }'
    x = text.index("x")
    for encoding, units in (("utf-16", x + 1), ("utf-8", x + 3 + 1), ("utf-32", x)):
        codec = Codec(text, encoding)
        client = codec.to_client(Pos(0, x))
        assert client.character == units, encoding
        assert codec.from_client(client) == Pos(0, x)


@pytest.mark.parametrize(
    ("text", "offset_of", "expected"),
    [
        ('model "a" {\n  reserve 4 GiB\n}\n', "4 GiB", ("model", ["reserve"])),
        ('rule "r" {\n  when (gpu.free < 1 GiB\n    and model.idle > 5m)\n}\n', "model.idle", ("rule", ["when", "(", "gpu.free", "<", "1 GiB", "and"])),
        ('model "a" { pool c4 { owner runtime; max 4 GiB } }\n', "4 GiB", ("pool", ["max"])),
    ],
)
def test_outline_knows_the_block_and_statement_at_the_cursor(text: str, offset_of: str, expected: tuple[str, list[str]]) -> None:
    outline = scan(text)
    offset = text.index(offset_of)
    assert (outline.block_at(offset).kind, [t.text for t in outline.tokens_before(offset)]) == expected
    assert outline.token_at(offset).text == offset_of


@settings(PROFILE, max_examples=examples(300))
@given(st.text(alphabet='model"{}();\n #a1.5GiB%', max_size=60))
def test_outline_never_fails_and_keeps_every_character(text: str) -> None:
    outline = scan(text)
    covered: set[int] = set()
    for token in outline.tokens:
        assert text[token.offset : token.end] == token.text
        assert covered.isdisjoint(range(token.offset, token.end))
        covered |= set(range(token.offset, token.end))
    assert {i for i, c in enumerate(text) if c not in " \t\f\r"} <= covered
    for offset in range(len(text) + 1):
        outline.block_at(offset)
        outline.tokens_before(offset)


BLOCK_PYGLS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pygls":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
import kvpolicy.cli
sys.exit(kvpolicy.cli.main(["lsp"]))
"""


def test_lsp_without_the_extra_says_which_extra_and_exits_2() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCK_PYGLS], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "kvpolicy lsp: needs the lsp extra (pygls not installed); install it with: pip install 'kvpolicy[lsp]'"]
