"""The example policies in policies/: lint clean (strict, with their own facts and
with a bare H200 capacity), formatted, and each has a sample facts file the
evaluator accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.facts_io import read_facts
from kvpolicy.lint.engine import lint_file
from kvpolicy.lint.load import load_policy
from kvpolicy.policy.resolve import model_settings
from kvpolicy.units import GiB

POLICIES = sorted((Path(__file__).resolve().parents[2] / "policies").glob("*.kvp"))
IDS = [p.stem for p in POLICIES]


def test_the_three_examples_exist() -> None:
    assert {"h200-dsv4-colocate", "dsv4-pro-tp8-fleet", "two-models"} <= set(IDS)


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_lints_clean_with_its_facts(policy: Path, capsys) -> None:
    facts = policy.with_suffix(".facts.json")
    assert facts.exists(), f"no sample facts for {policy.name}"
    assert main(["lint", "--strict", "--facts", str(facts), str(policy)]) == 0, capsys.readouterr().out
    result = lint_file(policy, facts=read_facts(facts))
    assert result.diagnostics == ()


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_lints_clean_on_a_bare_h200(policy: Path, capsys) -> None:
    assert main(["lint", "--strict", "--gpu-capacity", "141GiB", str(policy)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_formatted(policy: Path, capsys) -> None:
    assert main(["fmt", "--check", str(policy)]) == 0, f"run kvpolicy fmt {policy}"


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_facts_match_the_policy(policy: Path) -> None:
    """Every instance in the sample facts binds a model block of its policy, with its engine."""
    loaded = load_policy(policy)
    facts = read_facts(policy.with_suffix(".facts.json"))
    assert facts.gpus and facts.instances
    for inst in facts.instances:
        settings = model_settings(loaded, inst.model)
        assert settings.block is not None, f"{inst.id}: model {inst.model!r} binds no block"
        assert settings.engine in (None, inst.engine), inst.id
        for name, pool in inst.pools.items():
            if settings.engine is not None:
                from kvpolicy.engines import ENGINES

                assert name in ENGINES[settings.engine].pools, (inst.id, name)
            assert pool.bytes >= (pool.tensor_bytes or 0)
        if settings.reserve is not None and inst.reports_runtime_pools:
            assert inst.runtime_bytes <= settings.reserve, f"{inst.id}: reports more than its reserve"


def test_colocate_pool_figures_are_the_v4_flash_ones() -> None:
    """The Flash pools in the sample facts are what SGLang 0.5.23 allocates at 4M full
    tokens (the GPU figure matches the measured 32,671,531,008 bytes; reference/sglang-dsv4.md)."""
    facts = read_facts(POLICIES[IDS.index("h200-dsv4-colocate")].with_suffix(".facts.json"))
    flash = next(i for i in facts.instances if i.model == "deepseek-v4-flash")
    assert set(flash.pools) == {"swa", "c4", "c128", "indexer", "compressor_state"}
    assert flash.runtime_bytes == 32_671_531_008
    assert 30 * GiB < flash.runtime_bytes < 34 * GiB
