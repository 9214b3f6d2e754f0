"""``kvpolicy init``, ``kvpolicy schema``, the documents people write (facts and .kvtest.json
with units, did-you-mean for unknown keys) and the example of docs/policy-tests.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvpolicy.cli import main
from kvpolicy.facts_io import FactsError, parse_facts

import pytest

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def test_init_writes_a_starter_that_lints_clean_and_keeps_an_existing_file(tmp_path, capsys):
    target = tmp_path / "policy.kvp"
    assert main(["init", str(target)]) == 0
    text = target.read_text()
    assert text.startswith("# A kvpolicy policy") and text.count("#") > 10
    capsys.readouterr()
    assert main(["lint", "--strict", "--gpu-capacity", "141GiB", str(target)]) == 0, capsys.readouterr().out
    target.write_text("mine\n")
    assert main(["init", str(target)]) == 1 and target.read_text() == "mine\n"
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["init", str(target), "--force", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": 1, "file": str(target), "written": True}
    assert target.read_text() == text
    assert main(["init", "-"]) == 0 and capsys.readouterr().out == text


@pytest.mark.parametrize("name", ["facts", "kvtest", "decision", "state"])
def test_schema_prints_the_published_schema(name, capsys):
    assert main(["schema", name]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / f"{name}.schema.json").read_text()


def test_the_facts_and_kvtest_schemas_describe_every_field():
    for name in ("facts", "kvtest"):
        schema = json.loads((REPO / "docs" / f"{name}.schema.json").read_text())
        for definition in [schema, *schema.get("$defs", {}).values()]:
            for field, spec in definition.get("properties", {}).items():
                assert spec.get("description"), f"{name}: {definition.get('title')}.{field} has no description"
    facts = json.loads((REPO / "docs" / "facts.schema.json").read_text())
    elastic = facts["$defs"]["ElasticFacts"]["properties"]
    assert "live KV blocks" in elastic["used"]["description"] and "mapped" in elastic["mapped"]["description"]
    sizes = [spec["type"] for spec in facts["$defs"]["GpuFacts"]["properties"]["capacity"]["anyOf"]]
    assert sizes == ["integer", "string"]


def test_facts_take_sizes_with_units_or_bytes():
    facts = parse_facts(json.dumps({
        "gpus": [{"id": "cuda:0", "capacity": "80 GiB", "other_used": 1024}],
        "instances": [{"id": "a/0", "model": "a", "gpu": "cuda:0", "elastic": {"used": "1.5 GiB", "mapped": "2GiB"}}],
    }))
    assert facts.gpus[0].capacity == 80 * GiB and facts.gpus[0].other_used == 1024
    assert (facts.instances[0].elastic.used, facts.instances[0].elastic.mapped) == (3 * GiB // 2, 2 * GiB)
    with pytest.raises(FactsError, match=r"gpus\.0\.capacity: .*'80': a size needs a unit"):
        parse_facts(json.dumps({"gpus": [{"id": "cuda:0", "capacity": "80"}]}))


def test_unknown_keys_get_a_did_you_mean(tmp_path, capsys):
    with pytest.raises(FactsError, match=r"gpus\.0\.capasity: unknown field 'capasity'\n  hint: did you mean 'capacity'\?"):
        parse_facts(json.dumps({"gpus": [{"id": "cuda:0", "capasity": 1}]}))
    with pytest.raises(FactsError, match=r"instances\.0\.elastic\.maped: unknown field 'maped'\n  hint: did you mean 'mapped'\?"):
        parse_facts(json.dumps({"gpus": [{"id": "g", "capacity": 1}],
                                "instances": [{"id": "a", "model": "a", "gpu": "g", "elastic": {"maped": 1}}]}))
    (tmp_path / "p.kvp").write_text("version 1\n")
    (tmp_path / "t.kvtest.json").write_text(json.dumps({
        "schema": 1, "policy": "p.kvp",
        "cases": [{"name": "c", "facts": {"gpus": [{"id": "g", "capacity": "1 GiB"}]}, "expekt": {}}],
    }))
    assert main(["test", str(tmp_path)]) == 1
    assert "KVD010 error: cases.0.expekt: unknown field 'expekt'\n  hint: did you mean 'expect'?" in capsys.readouterr().out


def test_the_example_of_docs_policy_tests_is_the_shipped_file_and_passes(capsys):
    doc = (REPO / "docs" / "policy-tests.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", doc, flags=re.S)
    shipped = REPO / "policies" / "two-models.kvtest.json"
    assert json.loads(example) == json.loads(shipped.read_text())
    assert main(["test", str(shipped), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary"] == {"files": 1, "cases": 2, "passed": 2, "failed": 0}
