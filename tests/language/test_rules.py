"""The rule catalogue and the checks: metadata, documentation, generated docs, and examples that do what they say."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import kvpolicy.lint.rules
from kvpolicy import catalogue
from kvpolicy.catalogue import CHECK, DOC_SECTIONS, UNKNOWN_UNIT, Rule, all_rules, index
from kvpolicy.diagnostics import Severity
from kvpolicy.lint import docs
from kvpolicy.lint.engine import lint_text
from kvpolicy.lint.registry import CHECKS, Check, register
from kvpolicy.lint.rules import all_checks
from kvpolicy.units import GiB

RULES = all_rules()
IDS = [f"{r.code}-{r.name}" for r in RULES]
ROOT = Path(__file__).resolve().parents[2]

# How a rule's examples are linted: KV003's example is a file without `version 1`;
# over-commitment needs a GPU capacity to check against; the size cap and the work
# budget are lowered to what a short example can exceed.
NO_VERSION_WRAP = {"KV003"}
LINT_OPTIONS = {"KV017": {"gpu_capacity": 141 * GiB}, "KV026": {"max_bytes": 128}, "KV027": {"budget": 250}}


def _snippet(section: str) -> str:
    match = re.search(r"```\n(.*?)```", section, re.S)
    assert match, f"no code block in: {section!r}"
    return match.group(1)


def _lint_example(rule: Rule, section: str):
    text = _snippet(rule.sections()[section])
    if rule.code not in NO_VERSION_WRAP and not re.match(r"\s*version\b", text):
        text = "version 1\n" + text
    return lint_text(text, f"{rule.code}.kvp", **LINT_OPTIONS.get(rule.code, {}))


def test_there_are_enough_rules_and_codes_are_dense() -> None:
    codes = [r.code for r in RULES]
    assert len(codes) >= 25
    assert codes == [f"KV{i:03d}" for i in range(1, len(codes) + 1)], "codes are stable and never reused"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_metadata(rule: Rule) -> None:
    assert re.fullmatch(r"KV\d{3}", rule.code)
    assert re.fullmatch(r"[a-z]+(-[a-z0-9]+)*", rule.name)
    assert isinstance(rule.severity, Severity)
    assert rule.phase in ("parse", "check", "suppression")
    assert rule.summary().endswith("."), "the first docstring line is a sentence"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_docstring_has_every_section(rule: Rule) -> None:
    sections = rule.sections()
    assert list(sections) == list(DOC_SECTIONS)
    assert all(sections[s].strip() for s in DOC_SECTIONS)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_example_triggers_the_rule_and_use_instead_does_not(rule: Rule) -> None:
    bad = _lint_example(rule, "Example")
    assert rule.code in [d.code for d in bad.diagnostics], [d.render() for d in bad.diagnostics]
    good = _lint_example(rule, "Use instead")
    assert rule.code not in [d.code for d in good.diagnostics], [d.render() for d in good.diagnostics]
    assert good.errors == (), [d.render() for d in good.errors]


def test_one_check_per_module() -> None:
    found: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(kvpolicy.lint.rules.__path__):
        module = importlib.import_module(f"kvpolicy.lint.rules.{info.name}")
        found[info.name] = [name for name, obj in vars(module).items() if isinstance(obj, type) and obj in CHECKS.values()]
    assert {m: names for m, names in found.items() if len(names) != 1} == {}
    assert sum(len(v) for v in found.values()) == len(all_checks())


def test_every_check_phase_rule_has_its_check_and_no_other_rule_has_one() -> None:
    assert [c.rule for c in all_checks()] == [r for r in RULES if r.phase == CHECK]


def test_the_catalogue_refuses_bad_metadata() -> None:
    doc = UNKNOWN_UNIT.doc
    with pytest.raises(ValueError):
        Rule("KV1", "bad-code", Severity.ERROR, CHECK, True, doc)
    with pytest.raises(ValueError):
        Rule("KV999", "Bad_Name", Severity.ERROR, CHECK, True, doc)
    reused = Rule("KV001", "another-name", Severity.ERROR, CHECK, True, doc)
    with pytest.raises(ValueError):
        index([UNKNOWN_UNIT, reused])
    assert catalogue.rule_by_code("KV999") is None


def test_register_refuses_a_check_of_no_catalogue_rule_or_a_second_one() -> None:
    class NotCatalogued(Check):
        rule = Rule("KV999", "not-catalogued", Severity.ERROR, CHECK, True, UNKNOWN_UNIT.doc)

    class OfAParseRule(Check):
        rule = UNKNOWN_UNIT

    class Second(Check):
        rule = catalogue.OVER_COMMITMENT

    all_checks()
    for cls in (NotCatalogued, OfAParseRule, Second):
        with pytest.raises(ValueError):
            register(cls)
    assert "KV999" not in CHECKS and CHECKS["KV017"] is not Second


def test_generated_docs_are_current() -> None:
    """docs/lint-rules.md is generated from the catalogue: run `python -m kvpolicy.lint.docs`."""
    path = ROOT / "docs" / "lint-rules.md"
    assert path.read_text(encoding="utf-8") == docs.render(), "stale: run python -m kvpolicy.lint.docs"
    assert docs.main(["--check"]) == 0


def test_docs_check_fails_when_stale(tmp_path, capsys) -> None:
    stale = tmp_path / "lint-rules.md"
    stale.write_text("# old\n")
    assert docs.main(["--check", "--into", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"{stale} is stale: run python -m kvpolicy.lint.docs\n"
    assert stale.read_text() == "# old\n"
    assert docs.main(["--into", str(tmp_path)]) == 0
    assert docs.main(["--check", "--into", str(tmp_path)]) == 0
    assert stale.read_text() == docs.render()


def test_docs_have_a_section_per_rule_with_the_sarif_anchor() -> None:
    text = docs.render()
    for rule in RULES:
        assert f"\n## {rule.code} {rule.name}\n" in text
        assert f"(#{rule.code.lower()}-{rule.name})" in text


@pytest.mark.parametrize(
    ("when", "flagged"),
    [
        ("model.used < 3 GiB", "model.used < 3 GiB"),
        ("gpu.free < 8 GiB and 3 GiB >= model.used", "3 GiB >= model.used"),
        ("(model.used <= 10% and gpu.free < 8 GiB)", "model.used <= 10%"),
        ("model.used < 3 GiB and model.waiting == 0", None),  # says what waits
        ("model.used < 3 GiB and model.idle > 30s", None),  # an engine with work waiting is not idle
        ("model.used < 3 GiB or gpu.free < 1 GiB", None),  # low use alone does not hold the shrink
        ("not (model.used > 3 GiB)", None),  # not a bound the check reads; no guess
        ("model.used > 3 GiB", None),
    ],
)
def test_a_shrink_on_low_use_is_flagged_with_the_comparison_to_extend(when: str, flagged: str | None) -> None:
    text = f'version 1\nmodel "a" {{ min 1 GiB }}\nrule "r" {{\n  when {when}\n  shrink to min\n  grace 3s\n}}\n'
    found = [d for d in lint_text(text, "p.kvp").diagnostics if d.code == "KV030"]
    if flagged is None:
        assert found == []
        return
    (d,) = found
    assert text.split("\n")[d.line - 1][d.col - 1 : d.end_col - 1] == flagged
    assert d.hint == f"write `{flagged} and model.waiting == 0`, so the shrink ends when work waits for memory"
    fixed = text.replace(flagged, f"{flagged} and model.waiting == 0")
    assert [x.code for x in lint_text(fixed, "p.kvp").diagnostics] == []  # what the hint says is clean
