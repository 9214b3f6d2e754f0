"""A JSON document people write (facts, a policy test, a saved state) with problems is refused with
a diagnostic per problem: ``file:line:col: CODE error: message`` at the text it is about (the value,
the unknown key, the object missing a field), the codes of ``kvpolicy.document_codes``, in words
that name what it must be and show what was written, and a hint. Each code has a document here that
produces it; the catalogue's examples run through ``kvpolicy explain``; the reference generated from
the catalogue is current."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy import document_codes
from kvpolicy.catalogue import all_rules
from kvpolicy.cli import main
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.document_codes import CODES, MAX_DEPTH, MAX_SHOWN
from kvpolicy.evaluate.policytest import PolicyTestFile, run_test_file
from kvpolicy.facts_io import FactsError, parse_facts, read_facts
from kvpolicy.json_positions import line_col, parse
from kvpolicy.json_text import POLICY_TEST, DocumentInvalid, load_document
from kvpolicy.paths import MAX_INPUT_BYTES

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "two-models.kvp"
PLACE = re.compile(r"^facts\.json:(\d+):(\d+): (KVD\d{3}) error: ")


def refusal(text: str) -> FactsError:
    with pytest.raises(FactsError) as caught:
        parse_facts(text, "facts.json")
    return caught.value


def found(text: str) -> list[tuple[int, int, str, str]]:
    """(line, col, code, message) of each diagnostic ``text`` gets as facts."""
    return [(d.line, d.col, d.code, d.message) for d in refusal(text).diagnostics]


def at(text: str, d: Diagnostic) -> str:
    """The text from the place ``d`` names to the end of that line."""
    return text.split("\n")[d.line - 1][d.col - 1:]


def only(text: str) -> Diagnostic:
    (diagnostic,) = refusal(text).diagnostics
    return diagnostic


# ---- KVD001 not-utf8 ------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_are_named_at_the_first_of_them(tmp_path):
    path = tmp_path / "facts.json"
    path.write_bytes(b'{"schema": 1,\n "gpus": [{"id": "\xc3\xa9\xff"}]}')  # "é", then a byte no UTF-8 text has
    with pytest.raises(FactsError) as caught:
        read_facts(path)
    (d,) = caught.value.diagnostics
    assert (d.line, d.col, d.code, d.name, d.message) == (2, 20, "KVD001", "not-utf8", "not UTF-8 (byte 0xff)")
    assert d.hint == "save the file as UTF-8"
    row = path.read_bytes().split(b"\n")[1]
    assert row.decode("utf-8", errors="replace")[d.col - 1] == "\ufffd", "the column counts characters: é is one"
    assert str(caught.value) == f"{path}:2:20: KVD001 error: not UTF-8 (byte 0xff)\n  hint: save the file as UTF-8"


# ---- KVD002 json-syntax ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "place", "problem", "hint"), [
    ('{"schema": 1,\n "gpus": [{"id": "g", "capacity": 1},]}', (2, 38), "Expecting value", "JSON allows no comma before ] or }"),
    ('{"schema": 1, "now": 5,\n}', (2, 1), "Expecting property name enclosed in double quotes",
     "JSON allows no comma before ] or }"),
    ("{'schema': 1}", (1, 2), "Expecting property name enclosed in double quotes",
     'JSON writes strings and keys in double quotes: "..."'),
    ('{schema: 1}', (1, 2), "Expecting property name enclosed in double quotes", 'JSON writes keys in double quotes: "name"'),
    ('// the node\n{"schema": 1}', (1, 1), "Expecting value", "JSON has no comments"),
    ('{"gpus": [], "instances": [True]}', (1, 28), "Expecting value", "JSON writes true, false and null in lower case"),
    ('{"now": 1 "gpus": []}', (1, 11), "Expecting ',' delimiter", "a comma is missing before this, or a closing ] or } before it"),
    ('{"schema": 1}\n{"schema": 1}', (2, 1), "Extra data", "the document ended before this: a file holds one JSON value"),
    ('{"gpus": [{"id": "a\tb"}]}', (1, 20), "Invalid control character at",
     "a string cannot hold a line break or a tab as it is: write \\n or \\t"),
    ('{"gpus": [', (1, 11), "Expecting value", "the document ends early: is a value or a closing ] or } missing?"),
    ("", (1, 1), "Expecting value", "the file is empty: write a JSON object, {...}"),
    ('{"gpus": }', (1, 10), "Expecting value", 'a value goes here: a number, "a string", true, false, null, [...] or {...}'),
    ('\ufeff{"schema": 1}', (1, 1), "Unexpected UTF-8 BOM (decode using utf-8-sig)",
     "save the file as UTF-8 without a byte order mark"),
    ('{"a" 1}', (1, 6), "Expecting ':' delimiter", None),
])
def test_a_syntax_error_is_named_in_jsons_words_where_it_stopped_with_the_cause_where_known(text, place, problem, hint):
    d = only(text)
    assert (d.line, d.col, d.code, d.name) == (*place, "KVD002", "json-syntax")
    assert (d.end_line, d.end_col) == (place[0], place[1] + 1)
    assert (d.message, d.hint) == (f"not valid JSON: {problem}", hint)


# ---- KVD003 document-too-large --------------------------------------------------------------


def test_a_file_over_the_limit_is_named_where_the_limit_falls(tmp_path):
    path = tmp_path / "facts.json"
    path.write_bytes(b" " * (MAX_INPUT_BYTES - 10) + b'\n{"now": 12345, "gpus": []}\n')  # the limit: line 2, column 10
    with pytest.raises(FactsError) as caught:
        read_facts(path)
    (d,) = caught.value.diagnostics
    assert (d.line, d.col, d.code, d.name) == (2, 10, "KVD003", "document-too-large")
    assert d.message == "over 64 MiB: not read further"
    assert '{"now": 12345, "gpus": []}'[d.col - 1:].startswith("2345"), "the first byte past the limit"


# ---- KVD004 nested-too-deeply ----------------------------------------------------------------


@pytest.mark.parametrize("closed", [True, False], ids=["deeper-than-kvpolicy-reads", "deeper-than-python-parses"])
def test_a_document_nested_too_deeply_is_named_at_the_bracket_that_opens_the_level_past_the_limit(closed):
    levels = MAX_DEPTH if closed else 50_000
    text = '{"gpus": [{"id": "g", "capacity": 1, "x":\n  ' + "[" * levels + ("]" * levels + "}]}" if closed else "")
    d = only(text)
    opens = MAX_DEPTH + 1 - 3  # the document, the list of gpus and its object open levels 1 to 3
    assert (d.line, d.col, d.code, d.name) == (2, 2 + opens, "KVD004", "nested-too-deeply")
    assert d.message == f"nested more than {MAX_DEPTH} levels deep"
    assert d.hint == "no kvpolicy document nests more than a dozen levels: is it the right file?"
    assert at(text, d).startswith("[") and text.split("\n")[1][: d.col - 1] == "  " + "[" * (opens - 1)


def test_a_document_as_deep_as_the_limit_is_read_and_one_level_deeper_is_not():
    def test_file(levels: int) -> str:  # the document, its cases, a case and its state are levels 1 to 4
        state = {"a": json.loads("[" * (levels - 4) + "]" * (levels - 4))}
        return json.dumps({"schema": 1, "policy": "p.kvp", "cases": [{"name": "c", "facts": {}, "state": state}]})

    assert load_document(PolicyTestFile, test_file(MAX_DEPTH), "t.kvtest.json", kind=POLICY_TEST).cases[0].name == "c"
    with pytest.raises(DocumentInvalid) as caught:
        load_document(PolicyTestFile, test_file(MAX_DEPTH + 1), "t.kvtest.json", kind=POLICY_TEST)
    assert [d.code for d in caught.value.diagnostics] == ["KVD004"]


# ---- KVD005 number-too-long ------------------------------------------------------------------


def test_an_integer_of_too_many_digits_is_named_at_the_integer():
    digits = "9" * (sys.get_int_max_str_digits() + 1)
    text = f'{{"schema": 1, "gpus": [{{"id": "{digits}", "capacity": 1.{digits}}}],\n "now": {digits}}}'
    d = only(text)
    assert (d.line, d.col, d.code, d.name) == (2, 9, "KVD005", "number-too-long")
    assert (d.end_line, d.end_col) == (2, 9 + len(digits))
    assert d.message == f"a number with more than {sys.get_int_max_str_digits()} digits"


# ---- KVD006 wrong-document -------------------------------------------------------------------


DECISION = {"schema": 1, "now": 0.0, "policy": {"file": "p.kvp", "sha256": "0" * 64}, "gpus": [], "instances": [], "rules": []}


@pytest.mark.parametrize(("document", "words"), [
    (DECISION, "this is a decision (what 'kvpolicy explain --format json' prints), not facts"),
    ({"schema": 1, "rules": {}}, "this is a rule state (what explain --state and the controller's state.json hold), not facts"),
    ({"schema": 1, "policy": "p.kvp", "cases": []}, "this is a policy test (a .kvtest.json file), not facts"),
    ({"schema": 1, "diagnostics": [], "summary": {}}, "this is findings (what 'kvpolicy lint --format json' prints), not facts"),
])
def test_another_kind_of_document_is_named_as_what_it_is_at_its_start(document, words):
    text = "\n" + json.dumps(document, indent=1)
    d = only(text)
    assert (d.line, d.col, d.code, d.name, d.message) == (2, 1, "KVD006", "wrong-document", words)
    assert d.hint == "expected facts (kvpolicy schema facts) or a 'kvpolicy status --format json' document"


def test_facts_given_as_a_policy_test_are_named_so():
    with pytest.raises(DocumentInvalid) as caught:
        load_document(PolicyTestFile, '{"schema": 1, "gpus": []}', "t.kvtest.json", kind=POLICY_TEST)
    (d,) = caught.value.diagnostics
    assert (d.file, d.line, d.col, d.code, d.message) == ("t.kvtest.json", 1, 1, "KVD006", "this is facts, not a policy test")


def test_a_schema_this_kvpolicy_does_not_read_is_named_at_its_value_and_nothing_else_is_checked():
    text = '{"gpus": [{"id": 7}],\n "schema": 2}'
    d = only(text)
    assert (d.line, d.col, d.code, d.message) == (2, 12, "KVD006", "facts schema 2 is not supported: this kvpolicy reads schema 1")
    assert d.hint == "a newer kvpolicy wrote it? use that one, or write schema 1 (kvpolicy schema facts)"
    assert found('{"schema": "1"}') == [(1, 12, "KVD008", 'schema: must be 1, not "1"')], "not a version: a value"


# ---- KVD007 wrong-type, KVD008 value-not-allowed ---------------------------------------------------


def test_the_wrong_kind_of_value_says_the_kind_in_jsons_words_at_the_value():
    text = '{"schema": 1,\n "gpus": [{"id": 0, "capacity": 1}], "instances": {"a": 1}}'
    assert found(text) == [(2, 18, "KVD007", "gpus.0.id: must be a string, not 0"),
                           (2, 51, "KVD007", "instances: must be a list ([...]), not {\"a\": 1}")]
    assert [at(text, d)[:3] for d in refusal(text).diagnostics] == ["0, ", '{"a']
    assert found("[1, 2]") == [(1, 1, "KVD007", "(top level): must be an object ({...}), not [1, 2]")]
    assert refusal("[1, 2]").diagnostics[0].hint == "kvpolicy schema facts describes every field"


def test_a_value_out_of_range_is_named_where_it_is_with_what_was_written():
    text = '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": -5}],\n "instances": []}\n'
    error = refusal(text)
    assert str(error) == ("facts.json:2:40: KVD008 error: gpus.0.capacity: must be 0 or more, not -5\n"
                          "  hint: capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity).")
    (d,) = error.diagnostics
    assert at(text, d).startswith("-5}") and (d.end_line, d.end_col) == (2, 42)


def test_choices_are_written_as_json():
    text = ('{"schema": 1, "gpus": [{"id": "cuda:0", "capacity": 1}],\n "instances": [{"id": "a", "model": "m", '
            '"gpu": "cuda:0",\n  "pools": {"swa": {"owner": "rt", "bytes": 1}}}]}')
    assert found(text) == [(3, 30, "KVD008", 'instances.0.pools.swa.owner: must be "runtime" or "elastic", not "rt"')]


def test_values_that_disagree_are_each_named_at_the_later_or_the_referring_one():
    text = ('{"gpus": [{"id": "g", "capacity": 1},\n          {"id": "g", "capacity": 2}],\n'
            ' "instances": [{"id": "a", "model": "m", "gpu": "h"},\n               {"id": "a", "model": "m", "gpu": "g"}]}')
    error = refusal(text)
    assert found(text) == [(2, 18, "KVD008", "gpus.1.id: \"g\" is gpus.0's id too"),
                           (3, 49, "KVD008", 'instances.0.gpu: "h" is not a GPU of these facts'),
                           (4, 23, "KVD008", "instances.1.id: \"a\" is instances.0's id too")]
    assert [at(text, d)[:3] for d in error.diagnostics] == ['"g"', '"h"', '"a"']
    assert [d.hint for d in error.diagnostics] == [
        "each GPU is listed once", 'the GPUs listed: "g"',
        "each engine process is listed once per GPU it uses, under an id of its own"]
    alone = refusal('{"instances": [{"id": "a", "model": "m", "gpu": "h"}]}')
    assert alone.diagnostics[0].hint == "list it under gpus"


def test_values_that_disagree_in_a_status_document_are_placed_in_it():
    status = {"written_at": 5.0, "gpus": [{"id": "g", "capacity": 1, "guard": 0, "budget": 1},
                                          {"id": "g", "capacity": 1, "guard": 0, "budget": 1}], "instances": []}
    (d,) = refusal(json.dumps(status)).diagnostics
    assert d.message == "gpus.1.id: \"g\" is gpus.0's id too" and at(json.dumps(status), d).startswith('"g", "capacity"')


# ---- KVD009 missing-field, KVD010 unknown-key -----------------------------------------------


def test_a_missing_field_is_named_at_the_object_that_lacks_it_with_what_the_field_is():
    text = '{"schema": 1, "gpus": [{"id": "cuda:0"}],\n "instances": []}'
    d = only(text)
    assert (d.line, d.col, d.code, d.name, d.message) == (1, 24, "KVD009", "missing-field", "gpus.0.capacity: required, not given")
    assert at(text, d).startswith('{"id": "cuda:0"}') and (d.end_line, d.end_col) == (1, 25)
    assert d.hint == "capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity)."


def test_an_unknown_key_is_named_at_the_key_with_the_field_meant_or_the_fields_there():
    text = '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": 5, "capcity": 3}],\n "instances": []}\n'
    d = only(text)
    assert (d.line, d.col, d.code, d.name, d.message) == (2, 43, "KVD010", "unknown-key", "gpus.0.capcity: unknown field 'capcity'")
    assert d.hint == "did you mean 'capacity'?" and at(text, d).startswith('"capcity"') and d.end_col == d.col + 9
    d = only('{"gpus": [], "xyzzy": 1}')
    assert (d.col, d.message) == (14, "xyzzy: unknown field 'xyzzy'")
    assert d.hint == "fields here: schema, now, gpus, instances"


# ---- every problem, in order, bounded -----------------------------------------------------------


def test_every_problem_is_reported_in_the_order_of_the_text_and_past_ten_counted():
    gpus = [{"capacity": -i - 1, "id": f"g{i}"} for i in range(12)]
    text = json.dumps({"schema": 1, "gpus": gpus, "now": "soon"}, indent=2)  # 13 problems
    error = refusal(text)
    places = [(d.line, d.col) for d in error.diagnostics]
    assert places == sorted(places) and len(places) == MAX_SHOWN and error.more == 13 - MAX_SHOWN
    assert [d.message for d in error.diagnostics] == [f"gpus.{i}.capacity: must be 0 or more, not {-i - 1}" for i in range(MAX_SHOWN)]
    assert all(at(text, d).startswith(f"{-i - 1},") for i, d in enumerate(error.diagnostics))
    assert str(error).endswith(f"\nfacts.json: and {13 - MAX_SHOWN} more problems")


def test_a_status_documents_problems_are_placed_in_the_status_document():
    status = ('{"written_at": "soon", "controller": null,\n "gpus": [{"id": "cuda:0", "capacity": 10, "other_used": 0}],\n'
              ' "instances": [{"id": "a", "model": "m", "gpu": "cuda:0", "rank": "x", "pools": {}}]}')
    assert found(status) == [(1, 16, "KVD007", 'now: must be a number, not "soon"'),
                             (3, 67, "KVD007", 'instances.0.rank: must be a whole number, not "x"')]
    assert [at(status, d)[:6] for d in refusal(status).diagnostics] == ['"soon"', '"x", "'], "written_at; rank"
    no_figures = status.replace('"capacity": 10', '"capacity": null')
    assert at(no_figures, refusal(no_figures).diagnostics[0]).startswith("null, ")
    assert found(no_figures) == [(2, 40, "KVD009", "gpus.0.capacity: GPU 'cuda:0' has no capacity in this status "
                                                   "(no controller published its figures)")]
    assert found(status.replace('"gpus": [{', '"gpus": [7, {')) == [(2, 11, "KVD007", "gpus.0: a GPU entry must be an object ({...})")]


def test_a_policy_test_s_facts_file_with_problems_fails_its_case_with_each_problem(tmp_path):
    (tmp_path / "p.kvp").write_text("version 1\n")
    row = ' "gpus": [{"id": "g", "capacity": "80"}, {"id": 7}]}'
    node = tmp_path / "node.json"
    node.write_text('{"schema": 1,\n' + row)
    test_file = tmp_path / "t.kvtest.json"
    test_file.write_text(json.dumps({"schema": 1, "policy": "p.kvp", "cases": [{"name": "c", "facts": "node.json"}]}))
    (result,) = run_test_file(test_file)
    value, second, seven = row.index('"80"') + 1, row.index('{"id": 7') + 1, row.index("7") + 1
    assert not result.passed and result.failures == [
        f"cannot run: {node}:2:{value}: KVD008 error: gpus.0.capacity: '80': a size needs a unit, e.g. 80 GiB "
        "(units: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
        f"cannot run: {node}:2:{second}: KVD009 error: gpus.1.capacity: required, not given",
        f"cannot run: {node}:2:{seven}: KVD007 error: gpus.1.id: must be a string, not 7",
    ]


NUMERIC = {"gpus": ("capacity", "other_used"), "instances": ("rank", "pid", "idle_seconds")}


@st.composite
def damaged_facts(draw: st.DrawFn) -> tuple[str, tuple[str, ...], object]:
    """Valid facts, one numeric value replaced by a bad one, written with any indentation."""
    gpus = [{"id": f"cuda:{i}", "capacity": draw(st.integers(1, 2**40)), "other_used": 0}
            for i in range(draw(st.integers(1, 3)))]
    instances = [{"id": f"m/{i}", "model": "m", "gpu": gpus[i % len(gpus)]["id"], "rank": 0, "pid": 1 + i,
                  "idle_seconds": 0.5, "pools": {}} for i in range(draw(st.integers(0, 3)))]
    doc = {"schema": 1, "gpus": gpus, "instances": instances}
    part = draw(st.sampled_from([p for p in NUMERIC if doc[p]]))
    index = draw(st.integers(0, len(doc[part]) - 1))
    field = draw(st.sampled_from(NUMERIC[part]))
    bad = draw(st.sampled_from(["x", [1], {"a": 1}, *([-7, True] if part == "gpus" else [])]))  # sizes refuse both
    doc[part][index][field] = bad
    indent = draw(st.sampled_from([None, 1, 2, 4]))
    return json.dumps(doc, indent=indent), (part, str(index), field), bad


@settings(max_examples=150, deadline=None)
@given(damaged_facts())
def test_the_place_named_is_where_the_bad_value_was_written(case):
    text, path, bad = case
    (d,) = refusal(text).diagnostics
    assert d.message.startswith(f"{'.'.join(path)}: "), d
    # a size may be a string ("40 GiB"), so "x" there is a value not allowed; elsewhere a string is the wrong kind
    allowed_kind = bad in (-7, True) or (bad == "x" and path[0] == "gpus")
    assert d.code == ("KVD008" if allowed_kind and not isinstance(bad, (list, dict)) else "KVD007"), d
    offset = sum(len(row) + 1 for row in text.split("\n")[: d.line - 1]) + d.col - 1
    value, end = json.JSONDecoder().raw_decode(text, offset)
    assert value == bad and line_col(text, end) == (d.end_line, d.end_col), (d, text)


def test_positions_count_lines_and_characters_from_one():
    text = '{\n  "a": [1, {"b": "é"}, NaN]\n}'
    document = parse(text)
    assert document is not None
    assert line_col(text, document.offset_of(("a", 1, "b"))) == (2, 18)
    assert line_col(text, document.offset_of(("a", 1, "b"), key=True)) == (2, 13)
    assert line_col(text, document.offset_of(("a", 5))) == (2, 8), "a path not in the document: its nearest ancestor"
    assert [line_col(text, o) for o in document.span_of(("a", 2))] == [(2, 24), (2, 27)], "what Python's reader takes"


# ---- the catalogue and its reference -------------------------------------------------------------


@pytest.mark.parametrize("code", [c for c in CODES if c.example is not None], ids=lambda c: c.code)
def test_each_documented_example_is_reported_as_documented(code, tmp_path, monkeypatch, capsys):
    """By the command it names (facts: ``kvpolicy explain POLICY --facts facts.json``)."""
    monkeypatch.chdir(tmp_path)
    example = code.example if isinstance(code.example, bytes) else code.example.encode()
    (tmp_path / code.example_file).write_bytes(example)
    program, *argv = shlex.split(code.example_command)
    assert program == "kvpolicy" and code.example_file in argv
    assert main([str(POLICY) if arg == "POLICY" else arg for arg in argv]) == 1
    err = capsys.readouterr().err
    assert err == f"{code.output}\n"
    assert f"{code.example_file}:" in err and f": {code.code} error: " in err


def test_every_code_is_distinct_from_the_policy_rules_and_those_without_an_example_are_tested_above():
    codes = [c.code for c in CODES]
    assert codes == [f"KVD{n:03}" for n in range(1, len(codes) + 1)], "numbered in order, none skipped"
    assert not set(codes) & {r.code for r in all_rules()} and not {c.name for c in CODES} & {r.name for r in all_rules()}
    assert {c.code for c in CODES if c.example is None} == {"KVD003", "KVD005"}


def test_the_reference_is_generated_from_the_catalogue():
    """docs/document-errors.md: run `python -m kvpolicy.document_codes`."""
    path = REPO / "docs" / "document-errors.md"
    assert path.read_text(encoding="utf-8") == document_codes.render(), "stale: run python -m kvpolicy.document_codes"
    assert document_codes.main(["--check"]) == 0
    text = document_codes.render()
    for code in CODES:
        assert f"\n## {code.code} {code.name}\n" in text and f"(#{code.anchor()})" in text


def test_the_reference_check_fails_when_stale(tmp_path, capsys):
    stale = tmp_path / "document-errors.md"
    stale.write_text("# old\n")
    assert document_codes.main(["--check", "--into", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"{stale} is stale: run python -m kvpolicy.document_codes\n"
    assert document_codes.main(["--into", str(tmp_path)]) == 0
    assert stale.read_text() == document_codes.render()
