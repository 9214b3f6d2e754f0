"""The JSON Schemas under docs/ are the ones the models generate (regenerate:
``python -m kvpolicy.evaluate.schemas``)."""

from pathlib import Path

import pytest

from kvpolicy.evaluate.schemas import SCHEMAS, render

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_published_schema_is_current(name):
    published = (DOCS / name).read_text(encoding="utf-8")
    assert published == render(SCHEMAS[name]), f"docs/{name} is stale: run python -m kvpolicy.evaluate.schemas"


def test_the_generator_writes_and_checks_every_schema(tmp_path) -> None:
    from kvpolicy.evaluate.schemas import main

    assert main(["--check"]) == 0
    assert main(["--check", "--into", str(tmp_path)]) == 1, "none there yet"
    assert main(["--into", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SCHEMAS)
    assert main(["--check", "--into", str(tmp_path)]) == 0


def test_facts_schema_accepts_the_design_example():
    import json

    from kvpolicy.facts import Facts

    example = {
        "schema": 1, "now": 1764450000.0,
        "gpus": [{"id": "cuda:0", "capacity": 150109880320, "other_used": 64424509440}],
        "instances": [
            {"id": "dsv4-flash/0", "model": "deepseek-v4-flash", "engine": "sglang", "gpu": "cuda:0", "rank": 0,
             "pid": 4242, "pools": {"swa": {"owner": "runtime", "bytes": 2640000000},
                                    "c4": {"owner": "runtime", "bytes": 3223000000}}, "idle_seconds": 12.5},
            {"id": "qwen/0", "model": "qwen3-8b", "engine": "vllm", "engine_id": "qwen", "gpu": "cuda:0", "rank": 0,
             "pid": 4243, "pools": {}, "elastic": {"used": 1073741824, "mapped": 1073741824}, "idle_seconds": 0.0},
        ],
    }
    facts = Facts.model_validate(example)
    assert json.loads(facts.to_json())["instances"][1]["engine_id"] == "qwen"
    with pytest.raises(ValueError, match="is not a GPU of these facts"):
        Facts.model_validate({**example, "gpus": []})
