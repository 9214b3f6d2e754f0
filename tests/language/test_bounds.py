"""Inputs that used to stall lint or fmt, or exhaust memory (issue 16, items 7 and 8).

Each runs under a hang guard (``HANG_S``, far above what it takes on a loaded
machine: it only catches a hang) and checks the answer, and where it can the
work counters; how fast they run is measured by benchmarks/bench_lint.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.lint.budget import WorkBudget
from kvpolicy.lint.engine import lint_bytes, lint_file, lint_text
from kvpolicy.lint.registry import CHECKS, Check
from kvpolicy.lint.rules import unreachable_model
from kvpolicy.lint.source import DEFAULT_MAX_POLICY_BYTES, MAX_POLICY_SIZE_ENV
from kvpolicy.policy import globs
from kvpolicy.policy.fmt import format_text
from kvpolicy.runtime.watch import PolicyWatcher

HANG_S = 60


def bounded(fn, *args, **kwargs):
    """``fn(*args)``, failing the test if it has not returned within HANG_S."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args, **kwargs).result(timeout=HANG_S)


def codes(result) -> list[tuple[str, int]]:
    return [(d.code, d.line) for d in result.diagnostics]


# ---- item 7: near-linear, or bounded ------------------------------------------------------


@pytest.mark.parametrize("marks", [16, 18, 40])
def test_a_star_then_many_question_marks_is_decided_in_polynomial_work(marks: int) -> None:
    """The issue's 94-byte policy (18 marks took 82 s and 2.2 GB): the second glob is unreachable."""
    first, second = "*" + "?" * (marks + 1), "*a" + "?" * marks
    text = f'version 1\nmodel "{first}" {{ priority 1 }}\nmodel "{second}" {{ priority 2 }}\n'
    assert codes(bounded(lint_text, text, "q.kvp")) == [("KV021", 3)]
    verdict = globs.inclusion(first, second)
    assert verdict.included is True and verdict.work < globs.PAIR_WORK_LIMIT
    # and the other way round it is a quick no: a name of marks + 1 other characters
    assert globs.inclusion(second, first).included is False


def test_a_pair_past_its_cap_is_undecided_and_not_reported() -> None:
    # ``*a`` then n marks as the outer pattern: its state sets are the subsets of n positions
    outer, inner = "*a" + "?" * 24 + "*", "*a" + "?" * 24 + "*?"
    verdict = globs.inclusion(outer, inner, 200)
    assert verdict.included is None and verdict.work > 200
    # It is included (inner's names have an 'a' and 25 more characters after it), but deciding
    # that takes more than the default cap too: the rule says nothing rather than guess.
    text = f'version 1\nmodel "{outer}" {{ priority 1 }}\nmodel "{inner}" {{ priority 2 }}\n'
    assert globs.inclusion(outer, inner).included is None
    assert codes(bounded(lint_text, text, "cap.kvp")) == []


def test_a_thousand_star_leading_globs_are_indexed_not_compared_pairwise() -> None:
    """500 ``*?NNN`` then 500 ``*-NNN``: each later glob is unreachable behind its partner."""
    lines = ["version 1"]
    lines += [f'model "*?{i:03d}" {{ priority 1 }}' for i in range(500)]
    lines += [f'model "*-{i:03d}" {{ priority 2 }}' for i in range(500)]
    globs.inclusion.cache_clear()
    result = bounded(lint_text, "\n".join(lines) + "\n", "many.kvp")
    assert codes(result) == [("KV021", 502 + i) for i in range(500)]
    assert all(f"'*?{i:03d}' (line {2 + i})" in d.message for i, d in enumerate(result.diagnostics))
    compared = globs.inclusion.cache_info().misses
    assert compared <= 4 * 1000, f"{compared} pairs compared: the index should leave a few per glob"


def test_the_rule_stops_at_its_own_cap(monkeypatch) -> None:
    lines = ["version 1"] + [f'model "*?{i:03d}" {{ priority 1 }}' for i in range(50)]
    lines += [f'model "*-{i:03d}" {{ priority 2 }}' for i in range(50)]
    text = "\n".join(lines) + "\n"
    globs.inclusion.cache_clear()
    assert len(lint_text(text, "cap.kvp").diagnostics) == 50
    monkeypatch.setattr(unreachable_model, "RULE_WORK_LIMIT", 0)
    globs.inclusion.cache_clear()
    assert len(lint_text(text, "cap.kvp").diagnostics) < 50  # fewer findings, never a wrong one


def test_a_200000_character_literal_prefix() -> None:
    stem = "a" * 200_000
    text = f'version 1\nmodel "{stem}*" {{ priority 1 }}\nmodel "{stem}?" {{ priority 2 }}\n'
    assert codes(bounded(lint_text, text, "long.kvp")) == [("KV021", 3)]


def test_twenty_thousand_suppressions() -> None:
    comments = "# kvpolicy: ignore[KV019] vendor sizes are decimal\n" * 20_000
    used = bounded(lint_text, f"version 1\n{comments}model \"m\" {{ reserve 1 GB }}\n", "s.kvp")
    assert codes(used) == []  # each covers the model's line, where KV019 is reported
    unused = bounded(lint_text, f"version 1\n{comments}model \"m\" {{ reserve 1 GiB }}\n", "s.kvp")
    assert len(unused.diagnostics) == 20_000
    assert {(d.code, d.message) for d in unused.diagnostics} == {("KV025", "KV019 is not reported on line 20002")}


def test_fmt_of_80000_comment_lines() -> None:
    text = "version 1\n" + "".join(f"# {i}\n" for i in range(80_000))
    formatted = bounded(format_text, text, "c.kvp")
    assert formatted == text
    assert bounded(format_text, formatted, "c.kvp") == formatted


# ---- item 8: a size cap ---------------------------------------------------------------------


def test_a_policy_over_the_cap_is_a_positioned_diagnostic() -> None:
    line = 'model "m" { priority 1 }  # padding\n'
    data = b"version 1\n" + line.encode() * (DEFAULT_MAX_POLICY_BYTES // len(line) + 10)
    result = lint_bytes(data, "big.kvp")
    assert result.policy is None and [d.code for d in result.diagnostics] == ["KV026"]
    d = result.diagnostics[0]
    before = data[:DEFAULT_MAX_POLICY_BYTES]
    assert (d.line, d.col) == (before.count(b"\n") + 1, len(before) - before.rfind(b"\n"))
    assert "1 MiB" in d.message and MAX_POLICY_SIZE_ENV in d.hint


def test_an_endless_file_is_read_only_up_to_the_cap() -> None:
    result = bounded(lint_file, "/dev/zero")  # was a MemoryError
    assert [d.code for d in result.diagnostics] == ["KV026"]


def test_the_cap_is_configurable(monkeypatch, tmp_path: Path, capsys) -> None:
    text = 'version 1\nmodel "m" { priority 1 }\n'
    monkeypatch.setenv(MAX_POLICY_SIZE_ENV, "16")
    assert [d.code for d in lint_text(text, "p.kvp").diagnostics] == ["KV026"]
    monkeypatch.setenv(MAX_POLICY_SIZE_ENV, "1KiB")
    assert lint_text(text, "p.kvp").diagnostics == ()
    monkeypatch.setenv(MAX_POLICY_SIZE_ENV, "lots")
    bad = lint_text(text, "p.kvp")
    assert [d.code for d in bad.diagnostics] == ["KV026"] and "lots" in bad.diagnostics[0].message
    monkeypatch.delenv(MAX_POLICY_SIZE_ENV)
    path = tmp_path / "p.kvp"
    path.write_text(format_text(text))
    assert main(["fmt", "--check", str(path)]) == 0
    monkeypatch.setenv(MAX_POLICY_SIZE_ENV, "16")
    capsys.readouterr()
    assert main(["fmt", "--check", str(path)]) == 1
    assert "KV026" in capsys.readouterr().err


# ---- item 8: a work budget for reload validation ------------------------------------------------


def test_past_its_budget_lint_stops_and_refuses_the_policy() -> None:
    text = "version 1\n" + "".join(f'model "m{i}*" {{ priority {i} }}\n' for i in range(50))
    budget = WorkBudget(10**9)
    assert lint_text(text, "b.kvp", budget=budget).policy is not None
    assert budget.spent > 0
    refused = lint_text(text, "b.kvp", budget=budget.spent - 1)
    assert refused.policy is None and [d.code for d in refused.errors] == ["KV027"]


class _Slow(Check):
    """A check that does a great deal of work (what a pathological policy would make a rule do)."""

    rule = CHECKS["KV021"].rule

    def check(self, ctx):
        for _ in range(1000):
            ctx.charge(100_000)
        return iter(())


def test_a_reload_over_budget_keeps_the_last_good_policy(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "policy.kvp"
    path.write_text('version 1\nmodel "a" { priority 1 }\n')
    watcher = PolicyWatcher(path)
    assert watcher.check_now() and watcher.current.revision == 1
    monkeypatch.setitem(CHECKS, "KV021", _Slow)  # an injected slow validator
    path.write_text('version 1\nmodel "a" { priority 2 }\n')
    assert not watcher.check_now()
    assert watcher.current.revision == 1 and watcher.current.policy.models[0].priority.value == 1
    assert watcher.last_reload.error.code == "KV027"


def test_a_reload_over_the_size_cap_keeps_the_last_good_policy(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "policy.kvp"
    path.write_text('version 1\nmodel "a" { priority 1 }\n')
    watcher = PolicyWatcher(path, debounce=0.001)
    assert watcher.check_now()
    monkeypatch.setenv(MAX_POLICY_SIZE_ENV, "40")
    path.write_text('version 1\nmodel "a" { priority 2 }\n# and more than forty bytes\n')
    assert not watcher.check_now()
    assert watcher.current.revision == 1 and watcher.last_reload.error.code == "KV026"
