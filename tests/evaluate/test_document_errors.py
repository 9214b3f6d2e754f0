"""A JSON document people write (facts, a policy test, a saved state) that fails validation is
refused at the line and column of the value (or the unknown key) it is about, in words that
name what it must be and show what was written."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.facts_io import FactsError, parse_facts
from kvpolicy.json_positions import line_col, parse

PLACE = re.compile(r"^facts\.json:(\d+):(\d+): invalid facts: ")


def refusal(text: str) -> str:
    with pytest.raises(FactsError) as caught:
        parse_facts(text, "facts.json")
    return str(caught.value)


def at(text: str, message: str) -> str:
    """The text from the place the message names to the end of that line."""
    match = PLACE.match(message)
    assert match, message
    line, col = int(match[1]), int(match[2])
    return text.split("\n")[line - 1][col - 1:]


def test_a_value_out_of_range_is_named_where_it_is_with_what_was_written():
    text = '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": -5}],\n "instances": []}\n'
    message = refusal(text)
    assert message == "facts.json:2:40: invalid facts: gpus.0.capacity: must be 0 or more, not -5"
    assert at(text, message).startswith("-5}")


def test_an_unknown_key_is_named_at_the_key_with_the_field_meant():
    text = '{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": 5, "capcity": 3}],\n "instances": []}\n'
    message = refusal(text)
    assert message.endswith("gpus.0.capcity: unknown field 'capcity'; did you mean 'capacity'?")
    assert at(text, message).startswith('"capcity"')


def test_a_missing_field_is_named_at_its_object_and_choices_are_written_as_json():
    text = ('{"schema": 1, "gpus": [{"id": "cuda:0"}],\n "instances": [{"id": "a", "model": "m", "gpu": "cuda:0",\n'
            '  "pools": {"swa": {"owner": "rt", "bytes": 1}}}]}')
    message = refusal(text)
    assert message.startswith("facts.json:1:24: ") and at(text, message).startswith('{"id": "cuda:0"}')
    assert 'instances.0.pools.swa.owner: must be "runtime" or "elastic", not "rt"' in message


def test_the_wrong_kind_of_value_says_the_kind_in_jsons_words():
    assert refusal('[1, 2]') == "facts.json:1:1: invalid facts: (top level): must be an object ({...}), not [1, 2]"
    assert refusal('{"schema": 2, "gpus": [], "instances": []}').endswith("schema: must be 1, not 2")


def test_a_status_document_is_checked_as_the_facts_it_makes_without_a_place():
    status = {"written_at": 1.0, "controller": None, "gpus": [{"id": "cuda:0", "capacity": 10, "other_used": 0}],
              "instances": [{"id": "a", "model": "m", "gpu": "cuda:0", "rank": "x", "pools": {}}]}
    message = refusal(json.dumps(status))
    assert message.startswith("facts.json: invalid facts: instances.0.rank: must be a whole number")


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
    message = refusal(text)
    assert f"invalid facts: {'.'.join(path)}: " in message, message
    line, col = map(int, PLACE.match(message).groups())
    offset = sum(len(row) + 1 for row in text.split("\n")[: line - 1]) + col - 1
    assert json.JSONDecoder().raw_decode(text, offset)[0] == bad, (message, text)


def test_positions_count_lines_and_characters_from_one():
    text = '{\n  "a": [1, {"b": "é"}]\n}'
    document = parse(text)
    assert document is not None
    assert line_col(text, document.offset_of(("a", 1, "b"))) == (2, 18)
    assert line_col(text, document.offset_of(("a", 1, "b"), key=True)) == (2, 13)
    assert line_col(text, document.offset_of(("a", 5))) == (2, 8), "a path not in the document: its nearest ancestor"
