"""docs/language.md: its policy examples say what the text around them says."""

from __future__ import annotations

import re
from pathlib import Path

from kvpolicy.engines import ENGINES
from kvpolicy.lint.engine import lint_text
from kvpolicy.policy.fmt import format_text

DOC = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```\n(.*?)```", DOC, re.S)


def test_the_opening_example_is_clean_and_formatted() -> None:
    example = BLOCKS[0]
    result = lint_text(example, "example.kvp")
    assert result.diagnostics == (), [d.render() for d in result.diagnostics]
    assert format_text(example) == example


def test_the_suppression_example_silences_what_it_says() -> None:
    example = next(b for b in BLOCKS if "kvpolicy: ignore" in b)
    result = lint_text("version 1\n" + example, "example.kvp")
    assert result.diagnostics == (), [d.render() for d in result.diagnostics]


def test_snippets_of_settings_parse() -> None:
    """Every block that starts with a statement keyword parses (no syntax error)."""
    for block in BLOCKS:
        if re.match(r"(version|defaults|gpu|model|rule)\b", block.strip()):
            text = block if block.startswith("version") else "version 1\n" + block
            codes = [d.code for d in lint_text(text, "snippet.kvp").diagnostics]
            assert "KV002" not in codes, block


def test_the_pool_names_per_engine_are_every_name_the_engines_take() -> None:
    """The paragraph "Pool names per engine" names every pool each engine's vocabulary has."""
    start = DOC.index("Pool names per engine:")
    paragraph = DOC[start : DOC.index("\n\n", start)]
    named = set(re.findall(r"[a-z][a-z0-9_]*", " ".join(re.findall(r"`([^`]+)`", paragraph))))
    for engine in ENGINES.values():
        assert engine.pools <= named, (engine.name, sorted(engine.pools - named))
        assert engine.elastic_pools <= named
