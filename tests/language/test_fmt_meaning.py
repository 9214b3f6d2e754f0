"""fmt keeps what lint reports: suppressions stay attached to the code they cover.

A suppression after code covers its line; alone on a line, the next line with code.
fmt moves code between lines (a one-line block opens up, `a; b` splits), so a
comment that stayed put could cover other code after formatting. Over many
generated policies with suppressions in every position — after a statement, after
a `;`, after a one-line block, alone above a line — lint's findings are the same
before and after fmt.
"""

from __future__ import annotations

import re
from collections import Counter

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
