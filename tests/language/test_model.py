"""The typed model: immutable, a span on every node, exact units, and the binding rules."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kvpolicy.diagnostics import PolicyError
from kvpolicy.lint.load import load_policy, policy_from_text
from kvpolicy.policy import globs
from kvpolicy.policy import model as m
from kvpolicy.policy.resolve import gpu_settings, model_settings
from kvpolicy.units import GiB, MiB

from .helpers import PROFILE

POLICY = """\
version 1

defaults {
  headroom 2 GiB
}

gpu * {
  headroom 5%
}

gpu "cuda:1" {
  capacity 80 GiB
  chunk 4 MiB
}

model "qwen3-*" { priority 10; max 40% }
model "qwen3-8b-*" { priority 20 }
model "qwen3-8b-instruct" { priority 30; reserve 1.5 GiB; min 2.5 MiB }
model "qwen?-8b-*" { priority 40 }
model "*-8b-instruct" { priority 50 }

rule "reclaim" {
  when gpu.free < 8 GiB and not (model.idle <= 250ms or model.engine == vllm)
  order priority asc, idle desc
  shrink to 10%
  grace 2m
  cooldown 1.5h
}
"""


@pytest.fixture(scope="module")
def parsed_policy() -> m.Policy:
    return policy_from_text(POLICY, "p.kvp")


def test_every_node_has_a_span_inside_the_file_and_its_parent(parsed_policy) -> None:
    lines = POLICY.split("\n")

    def check(node: m.Node, parent: m.Node | None) -> None:
        s = node.span
        assert 1 <= s.line <= s.end_line <= len(lines)
        assert 1 <= s.col <= len(lines[s.line - 1]) + 1 and 1 <= s.end_col <= len(lines[s.end_line - 1]) + 1
        if parent is not None:
            assert (parent.span.line, parent.span.col) <= (s.line, s.col)
            assert (s.end_line, s.end_col) <= (parent.span.end_line, parent.span.end_col)
        for child in node.children():
            check(child, node)

    check(parsed_policy, None)
    assert len(list(parsed_policy.walk())) >= 50


def test_spans_point_at_the_text(parsed_policy) -> None:
    lines = POLICY.split("\n")

    def text(node: m.Node) -> str:
        s = node.span
        assert s.line == s.end_line
        return lines[s.line - 1][s.col - 1 : s.end_col - 1]

    rule = parsed_policy.rules[0]
    assert text(rule.name) == '"reclaim"'
    assert text(rule.grace) == "2m"
    assert text(rule.when.operands[1]) == "not (model.idle <= 250ms or model.engine == vllm)"
    assert text(parsed_policy.models[2].reserve) == "1.5 GiB"


def test_immutable(parsed_policy) -> None:
    with pytest.raises(ValidationError):
        parsed_policy.models[0].priority = None  # type: ignore[misc]
    with pytest.raises(ValidationError):
        parsed_policy.version = None  # type: ignore[misc]
    assert isinstance(parsed_policy.statements, tuple)


def test_units_are_exact(parsed_policy) -> None:
    exact = parsed_policy.models[2]
    assert exact.reserve.bytes == 3 * GiB // 2
    assert exact.min.bytes == 5 * MiB // 2
    cap = parsed_policy.models[0].max
    assert isinstance(cap, m.PercentLit) and cap.percent == Decimal(40)
    assert cap.resolve(80 * GiB) == 32 * GiB
    assert cap.resolve(150109880320) == 150109880320 * 40 // 100
    rule = parsed_policy.rules[0]
    assert rule.grace.seconds == 120.0 and rule.cooldown.seconds == 5400.0
    assert rule.when.operands[1].operand.operands[0].right.seconds == 0.25
    assert rule.shrink_to.kind == "amount" and rule.shrink_to.amount.percent == Decimal(10)
    assert [(k.attribute.value, k.descending) for k in rule.order] == [("priority", False), ("idle", True)]


def test_decimal_units_and_fractional_bytes() -> None:
    p = policy_from_text('version 1\nmodel "a" { reserve 40 GB }  # kvpolicy: ignore[KV019] vendor GB\nmodel "b" { reserve 0.3 KiB }\n')
    assert p.models[0].reserve.bytes == 40 * 10**9
    assert p.models[1].reserve.bytes == 307  # floor of 307.2


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("qwen3-8b-instruct", "qwen3-8b-instruct"),  # exact beats every glob
        ("qwen3-8b-base", "qwen3-8b-*"),  # two 10-character globs match: the first in the file wins
        ("qwen4-8b-base", "qwen?-8b-*"),  # the longest glob that matches
        ("qwen3-32b", "qwen3-*"),
        ("llama-8b-instruct", "*-8b-instruct"),
        ("mistral", None),
    ],
)
def test_binding_is_exact_then_longest_then_first(parsed_policy, name, pattern) -> None:
    settings_ = model_settings(parsed_policy, name)
    assert settings_.pattern == pattern


def test_defaults_apply_where_nothing_is_said(parsed_policy) -> None:
    unbound = model_settings(parsed_policy, "mistral")
    assert (unbound.priority, unbound.reserve, unbound.weight, unbound.engine) == (0, None, 100, None)
    assert unbound.min_bytes(80 * GiB) == 0 and unbound.max_bytes(80 * GiB) == 80 * GiB
    bound = model_settings(parsed_policy, "qwen3-32b")
    assert bound.priority == 10 and bound.max_bytes(100 * GiB) == 40 * GiB and bound.min_bytes(100 * GiB) == 0


def test_gpu_settings_take_the_most_specific_block(parsed_policy) -> None:
    g0 = gpu_settings(parsed_policy, "cuda:0")
    assert g0.headroom_bytes(100 * GiB) == 5 * GiB and g0.capacity is None and g0.chunk == 2 * MiB
    g1 = gpu_settings(parsed_policy, "cuda:1")
    assert g1.capacity == 80 * GiB and g1.chunk == 4 * MiB and g1.headroom_bytes(80 * GiB) == 4 * GiB
    no_gpu_blocks = policy_from_text("version 1\ndefaults { headroom 2 GiB }\n")
    assert gpu_settings(no_gpu_blocks, "cuda:7").headroom_bytes(80 * GiB) == 2 * GiB


def test_policy_error_carries_every_diagnostic(tmp_path) -> None:
    path = tmp_path / "p.kvp"
    path.write_text('version 1\nmodel "a" { reserve 4 GiBB; priority 5000 }\nmodel "b" { reserve 1 GB }\n')
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    error = info.value
    assert (error.line, error.col, error.code) == (2, 23, "KV001")
    assert str(error).startswith(f"{path}:2:23: KV001 error: unknown unit 'GiBB'")
    assert [d.code for d in error.errors] == ["KV001", "KV014"]
    assert [d.code for d in error.diagnostics] == ["KV001", "KV014", "KV019"]  # warnings ride along


def test_policy_error_needs_an_error() -> None:
    from kvpolicy.diagnostics import Diagnostic, Severity

    warning = Diagnostic(file="p", line=1, col=1, end_line=1, end_col=2, code="KV019", name="decimal-unit",
                         severity=Severity.WARNING, message="m")
    with pytest.raises(ValueError):
        PolicyError([warning])


# ---- globs -------------------------------------------------------------------------

ALPHABET = "ab-"


def _names(max_len: int = 5):
    for n in range(max_len + 1):
        for chars in itertools.product(ALPHABET + "x", repeat=n):
            yield "".join(chars)


NAMES = list(_names())
PATTERNS = st.text(alphabet=ALPHABET + "*?", max_size=4)


@settings(PROFILE, max_examples=400)
@given(PATTERNS, PATTERNS)
def test_includes_agrees_with_brute_force(outer: str, inner: str) -> None:
    """``includes`` is exact on every name up to 5 characters (x stands for any other character)."""
    decided = globs.includes(outer, inner)
    assert decided is not None, "short patterns are always decided within the cap"
    if decided:
        assert all(globs.matches(outer, n) for n in NAMES if globs.matches(inner, n))
    else:
        # a counterexample exists; with patterns of at most 4 characters one is this short
        assert any(globs.matches(inner, n) and not globs.matches(outer, n) for n in NAMES)


@settings(PROFILE, max_examples=300)
@given(st.text(alphabet="ab*?", min_size=3, max_size=9).filter(lambda p: p.count("*") > 2), st.text(alphabet="abx", max_size=12))
def test_many_star_patterns_match_by_automaton_as_the_regex_does(pattern: str, name: str) -> None:
    """Beyond two stars ``matches`` runs the automaton (a backtracking regex is exponential there)."""
    assert globs.matches(pattern, name) == (globs._regex(pattern).fullmatch(name) is not None)


def test_specificity() -> None:
    assert globs.specificity("a", 5) > globs.specificity("abcdef*", 0)
    assert globs.specificity("abc*", 1) > globs.specificity("ab*", 0)
    assert globs.specificity("ab*", 0) > globs.specificity("a?*", 1)
