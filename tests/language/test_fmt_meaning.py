"""fmt keeps what lint reports: suppressions stay attached to the code they cover.

A suppression after code covers its line; alone on a line, the next line with code.
fmt moves code between lines (a one-line block opens up, `a; b` splits), so a
comment that stayed put could cover other code after formatting. Over many
generated policies with suppressions in every position — after a statement, after
a `;`, after a one-line block, alone above a line — lint's findings are the same
before and after fmt.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.diagnostics import PolicyError
from kvpolicy.lint.engine import lint_text
from kvpolicy.policy.fmt import format_text
from tests.language.strategies import valid_policies

def findings(text: str) -> Counter:
    """What lint says, without positions: code, severity and the words at the span."""
    result = lint_text(text, "p.kvp")
    lines = text.split("\n")
    out: Counter = Counter()
    for d in result.diagnostics:
        words = lines[d.line - 1][d.col - 1 : d.end_col - 1] if d.end_line == d.line and d.line <= len(lines) else ""
        out[(d.code, d.severity.value, re.sub(r"\s+", "", words))] += 1
    return out


@st.composite
def with_suppressions(draw) -> str:
    """A generated policy with findings, and suppressions of some of them, placed every way."""
    text = draw(valid_policies())
    if draw(st.booleans()):
        text = text.replace("GiB", "GB", draw(st.integers(1, 3)))  # decimal units: KV019
    reported = [d for d in lint_text(text).diagnostics if d.end_line == d.line]
    lines = text.split("\n")
    chosen = draw(st.lists(st.sampled_from(reported), max_size=3, unique_by=lambda d: d.line)) if reported else []
    for d in sorted(chosen, key=lambda d: d.line, reverse=True):
        code = draw(st.sampled_from([d.code, d.code, f"{d.code}, KV019", "KV020"]))
        comment = f"# kvpolicy: ignore[{code}] on purpose"
        line = lines[d.line - 1]
        semicolon = line.find(";", d.end_col - 1)
        how = draw(st.sampled_from(["after", "above", "semicolon"]))
        if how == "semicolon" and semicolon >= 0:  # `a;# kvpolicy: ignore[...]` then the rest below
            lines[d.line - 1 : d.line] = [line[: semicolon + 1] + draw(st.sampled_from(["", " "])) + comment, line[semicolon + 1 :]]
        elif how == "above":
            lines.insert(d.line - 1, comment)
        else:
            lines[d.line - 1] = line + draw(st.sampled_from(["  ", " ", ""])) + comment
    return "\n".join(lines)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_suppressions())
def test_fmt_keeps_lints_findings(text: str) -> None:
    try:
        formatted = format_text(text)
    except PolicyError:
        return  # fmt leaves a file with syntax errors alone
    assert format_text(formatted) == formatted, "fmt is not idempotent"
    assert findings(formatted) == findings(text), f"fmt changed what lint reports:\n{text}\n---\n{formatted}"


# ---- every kind of block, with comments after its '{' and '}' ----------------------------

_SUPPRESSION = "# kvpolicy: ignore[KV004, KV012, KV018, KV019, KV020] on purpose"
_COMMENTS = ("", "# plain", _SUPPRESSION)
# kind: (what comes before the block, its header, an item, a statement after it, what closes around it);
# the items' decimal units are KV019, and a rule's header has findings (KV018, KV020) of its own
_KINDS = {
    "defaults": ("", "defaults", "headroom 1 GB", 'model "z" {}', ""),
    "gpu": ("", "gpu *", "capacity 80 GB", 'model "z" {}', ""),
    "model": ("", 'model "m"', "min 1 GB", 'model "z" {}', ""),
    "rule": ("", 'rule "r"', "shrink to 1 GB", 'model "z" {}', ""),
    "unknown": ("", "frobnicate", "knob 1 GB", 'model "z" {}', ""),
    "pool": ('model "m" {\n  engine vllm\n', "  pool p", "max 1 GB", "weight 2", "  priority 1\n}\n"),
}
_BODIES = ("{}", "{\n}", "{\n\n}", "{ ITEM }", "{\nITEM\n}")


def _block_cases() -> list[pytest.param]:
    cases = []
    for kind, (before, head, item, sibling, after) in _KINDS.items():
        indent = head[: len(head) - len(head.lstrip())]
        for body, open_comment, close_comment, tail, above in itertools.product(
            _BODIES, _COMMENTS, _COMMENTS, ("", "; SIB"), ("", f"{indent}{_SUPPRESSION}\n"),  # above: covers the header
        ):
            if open_comment and "\n" not in body:
                continue  # a comment after '{' ends the line: the block spans lines
            block = body.replace("ITEM", item).replace("{", f"{{ {open_comment}", 1)
            text = f"version 1\n{before}{above}{head} {block}{tail.replace('SIB', sibling)} {close_comment}\n{after}"
            cases.append(pytest.param(text, id=f"{kind}-{len(cases)}"))
    return cases


@pytest.mark.parametrize("text", _block_cases())
def test_comments_after_braces_keep_lints_findings(text: str) -> None:
    """Each kind of block, empty or not, on one line or over several, with a plain comment or
    a suppression after its '{' and its '}': fmt's output parses, lint says the same, and
    formatting it again changes nothing."""
    formatted = format_text(text)
    assert format_text(formatted) == formatted, f"fmt is not idempotent:\n{text}\n---\n{formatted}"
    assert findings(formatted) == findings(text), f"fmt changed what lint reports:\n{text}\n---\n{formatted}"
