"""JSON Schemas of the documents that cross a boundary, as published under docs/.

``python -m kvpolicy.evaluate.schemas docs/`` writes them; a test fails when the
files under docs/ differ from what the models say.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.facts import Facts

SCHEMAS: dict[str, type[BaseModel]] = {
    "facts.schema.json": Facts,
    "decision.schema.json": Decision,
    "state.schema.json": State,
}


def render(model: type[BaseModel]) -> str:
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path) -> None:
    for name, model in SCHEMAS.items():
        (directory / name).write_text(render(model), encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
