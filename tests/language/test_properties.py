"""Property tests: generated valid policies round-trip through fmt; broken ones
only ever produce diagnostics inside the file — never an exception, never a hang.

About 11,000 cases per run with the default ``ci`` profile (see conftest.py).
"""

from __future__ import annotations

import re
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark
from lark import Lark

from kvpolicy.lint.engine import LintResult, decode_policy, lint_text
from kvpolicy.diagnostics import PolicyError
from kvpolicy.policy.fmt import format_text
from kvpolicy.policy.lark_parser import grammar_text

from .helpers import PROFILE, TERMINAL_NAMES, comment_texts, examples, semantic_dump, shows_terminal_name
from .strategies import mutated, valid_policies

SECONDS_PER_CASE = 60
"""A case that takes longer than this is a hang (the slowest real ones take milliseconds; the bound is for a loaded machine)."""


@contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging (SIGALRM: main thread on POSIX, which is where pytest runs)."""
    if sys.platform == "win32":
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"took more than {seconds}s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def lint_bytes(data: bytes) -> tuple[LintResult, list[str]]:
    """Lint raw bytes as ``kvpolicy lint`` does; also return the lines positions refer to."""
    try:
        text = decode_policy(data, "p.kvp")
    except PolicyError as exc:
        lines = data.decode("utf-8", "replace").split("\n")
        return LintResult("p.kvp", None, exc.diagnostics), lines
    return lint_text(text, "p.kvp"), text.split("\n")


def check_diagnostics(result: LintResult, lines: list[str]) -> None:
    """Every diagnostic lies inside the file, reads like a sentence, and policy is None iff an error exists."""
    has_error = any(d.is_error for d in result.diagnostics)
    assert (result.policy is None) == has_error
    for d in result.diagnostics:
        assert 1 <= d.line <= len(lines), d
        assert 1 <= d.col <= len(lines[d.line - 1]) + 1, (d, lines[d.line - 1])
        assert (d.end_line, d.end_col) >= (d.line, d.col), d
        assert d.end_line <= len(lines), d
        for text in (d.message, d.hint or ""):
            assert not shows_terminal_name(text), text
            # one line each, and no pattern from the grammar (`[A-Za-z_]...`) in place of words
            assert "\n" not in text and "\r" not in text, text
            assert "[A-Za-z" not in text, text
        assert d.message and d.message == d.message.strip()


# ---- valid policies --------------------------------------------------------------


@settings(PROFILE, max_examples=examples(900))
@given(valid_policies())
def test_valid_policies_lint_clean_and_format_safely(text: str) -> None:
    result = lint_text(text, "p.kvp")
    assert result.errors == (), [d.render() for d in result.errors]
    formatted = format_text(text)
    assert format_text(formatted) == formatted, "fmt is not idempotent"
    after = lint_text(formatted, "p.kvp")
    assert after.errors == ()
    assert semantic_dump(after.policy) == semantic_dump(result.policy), "fmt changed the meaning"
    assert sorted(comment_texts(formatted)) == sorted(comment_texts(text)), "fmt lost or changed a comment"
    # the warnings are the same findings, only moved
    assert [(d.code, d.message) for d in after.diagnostics] == [(d.code, d.message) for d in result.diagnostics]


# ---- broken policies -----------------------------------------------------------------


ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted(
    p.read_bytes().decode("utf-8", "replace")
    for pattern in ("policies/*.kvp", "tests/golden/lint/*.kvp", "tests/golden/fmt/*.kvp")
    for p in ROOT.glob(pattern)
)
"""Real policies, valid and broken: cheap to draw, so most mutation cases start here."""


@settings(PROFILE, max_examples=examples(7000))
@given(mutated(st.sampled_from(CORPUS)))
def test_mutated_corpus_only_produces_diagnostics(data: bytes) -> None:
    with time_limit(SECONDS_PER_CASE):
        result, lines = lint_bytes(data)
    check_diagnostics(result, lines)


@settings(PROFILE, max_examples=examples(600))
@given(mutated(valid_policies()))
def test_mutated_generated_policies_only_produce_diagnostics(data: bytes) -> None:
    with time_limit(SECONDS_PER_CASE):
        result, lines = lint_bytes(data)
    check_diagnostics(result, lines)


@settings(PROFILE, max_examples=examples(500))
@given(st.binary(max_size=300))
def test_random_bytes_only_produce_diagnostics(data: bytes) -> None:
    with time_limit(SECONDS_PER_CASE):
        result, lines = lint_bytes(data)
    check_diagnostics(result, lines)
    assert result.policy is None or data.lstrip().startswith((b"version", b"#", b"\xef\xbb\xbf", b";"))


@settings(PROFILE, max_examples=examples(800))
@given(st.text(alphabet='version1 model"a"{}rule"r"when gpu.free<8GiB and or not()shrink to min;\n#,*pool swa', max_size=120))
def test_policy_shaped_noise_only_produces_diagnostics(text: str) -> None:
    with time_limit(SECONDS_PER_CASE):
        result = lint_text(text, "p.kvp")
    check_diagnostics(result, text.split("\n"))


def _grammar_strategy() -> st.SearchStrategy[str]:
    """Texts the grammar accepts, with a space around every token so the lexer sees them."""
    # Hypothesis reads the grammar's rules, which the policy parser, loaded from Lark's
    # cache of the analysed grammar, does not keep: so a Lark of the same grammar.
    lark = Lark(grammar_text(), parser="lalr")
    explicit = {
        # no keywords: where a statement starts, a keyword is always read as that keyword
        "NAME": st.sampled_from(["vllm", "sglang", "swa", "target", "idle", "asc", "desc", "x"]),
        "ATTRIBUTE": st.sampled_from(["gpu.free", "model.idle", "model.engine", "gpu.fre", "a.b"]),
        "STRING": st.sampled_from(['"qwen3-*"', '"cuda:0"', '"a b"', '""']),
        "QUANTITY": st.sampled_from(["1", "0", "40 GiB", "2MiB", "40%", "60s", "-1 GiB", "4 GiBB", "1.5", "99999999999999 TiB"]),
        "COMPARE": st.sampled_from(["<", "<=", ">", ">=", "==", "!="]),
        "_SEP": st.sampled_from(["\n", ";"]),
        "COMMENT": st.just(""),  # a comment would swallow the rest of its line
    }
    for term in lark.terminals:
        if term.name not in explicit and term.pattern.type == "str":
            explicit[term.name] = st.just(term.pattern.value)
    padded = {name: strategy.map(lambda s: f" {s} ") for name, strategy in explicit.items()}
    return from_lark(lark, explicit=padded)


@settings(PROFILE, max_examples=examples(1000))
@given(_grammar_strategy())
def test_grammar_generated_text_parses_and_formats(text: str) -> None:
    """Anything the grammar derives parses without a syntax error, and fmt keeps its meaning."""
    with time_limit(SECONDS_PER_CASE):
        result = lint_text(text, "p.kvp")
    check_diagnostics(result, text.split("\n"))
    assert not [d for d in result.diagnostics if d.code == "KV002"], [d.render() for d in result.diagnostics]
    formatted = format_text(text)
    assert format_text(formatted) == formatted
    again = lint_text(formatted, "p.kvp")
    # the same findings (messages quote values as written, and fmt respells them)
    assert sorted(d.code for d in again.diagnostics) == sorted(d.code for d in result.diagnostics)
    if result.policy is not None:
        assert semantic_dump(again.policy) == semantic_dump(result.policy)


# ---- extremes, by hand ---------------------------------------------------------------

EXTREMES = {
    "nots": 'version 1\nrule "r" { when ' + "not " * 5000 + "gpu.free < 1 GiB }\n",
    "parens": 'version 1\nrule "r" { when ' + "(" * 5000 + "gpu.free < 1 GiB" + ")" * 5000 + " }\n",
    "braces": "version 1\n" + "x {" * 5000 + "}" * 5000 + "\n",
    "unclosed-braces": "version 1\n" + "x {\n" * 5000,
    "unclosed-parens": 'version 1\nrule "r" { when ' + "(\n" * 5000,
    "long-and": 'version 1\nrule "r" { when ' + " and ".join(["gpu.free < 1 GiB"] * 3000) + "; shrink to min; grace 1s }\n",
    "long-line": 'version 1\nmodel "' + "a" * 1_000_000 + '" {}\n',
    "many-lines": "version 1\n" + "\n" * 200_000,
    "many-errors": "version 1\n" + 'model "a" { priority }\n' * 2000,
    "huge-number": "version 1\nmodel \"a\" { reserve 1" + "0" * 100_000 + " GiB }\n",
    "nul": "version 1\x00\n",
    "only-semicolons": ";" * 10_000,
}


@pytest.mark.parametrize("name", sorted(EXTREMES))
def test_extreme_inputs(name: str) -> None:
    text = EXTREMES[name]
    with time_limit(SECONDS_PER_CASE):
        result = lint_text(text, "p.kvp")
    check_diagnostics(result, text.split("\n"))
    try:
        with time_limit(SECONDS_PER_CASE):
            format_text(text)
    except PolicyError:
        pass


def test_terminal_name_pattern_catches_what_it_should() -> None:
    """The guard itself: the names Lark would print are caught, plain words are not."""
    for bad in ("expected __ANON_0", "got SEMICOLON", "LBRACE", "expected NAME", "_SEP", "QUANTITY", "$END", "Token('NAME', 'x')"):
        assert TERMINAL_NAMES.search(bad), bad
    for fine in ("'priority' needs a number", "a name such as vllm", "the end of the file", "names are quoted strings"):
        assert not TERMINAL_NAMES.search(fine), fine


def test_valid_policy_strategy_is_varied() -> None:
    """The generator exercises what fmt must handle (guards against a strategy that degenerates)."""
    seen = {"semicolon": False, "comment": False, "tab": False, "paren-newline": False, "glob": False, "pool": False}

    @settings(PROFILE, max_examples=150)
    @given(valid_policies())
    def collect(text: str) -> None:
        seen["semicolon"] |= ";" in text
        seen["comment"] |= "#" in text
        seen["tab"] |= "\t" in text
        seen["paren-newline"] |= bool(re.search(r"\([^)]*\n", text))
        seen["glob"] |= '*"' in text
        seen["pool"] |= "pool " in text

    collect()
    assert all(seen.values()), seen


def test_hypothesis_budget() -> None:
    """Keep the property tests above 10,000 cases per CI run (the issue's floor)."""
    tests = (
        test_valid_policies_lint_clean_and_format_safely,
        test_mutated_corpus_only_produces_diagnostics,
        test_mutated_generated_policies_only_produce_diagnostics,
        test_random_bytes_only_produce_diagnostics,
        test_policy_shaped_noise_only_produces_diagnostics,
        test_grammar_generated_text_parses_and_formats,
    )
    total = sum(t._hypothesis_internal_use_settings.max_examples for t in tests)  # type: ignore[attr-defined]
    assert total >= 10_000 * min(1.0, examples(1000) / 1000)
