"""JSON Schemas of the documents that cross a boundary, as published under docs/.

``python -m kvpolicy.evaluate.schemas docs/`` writes them (``kvpolicy schema NAME`` prints
one); a test fails when the files under docs/ differ from what the models say. Documents
people write (facts, ``.kvtest.json`` files) are described as they may be written (sizes as
integers or strings with a unit); documents kvpolicy writes, as it writes them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.evaluate.policytest import PolicyTestFile
from kvpolicy.facts import Facts

SCHEMAS: dict[str, type[BaseModel]] = {
    "facts.schema.json": Facts,
    "kvtest.schema.json": PolicyTestFile,
    "decision.schema.json": Decision,
    "state.schema.json": State,
}
WRITTEN_BY_PEOPLE = (Facts, PolicyTestFile)
"""Their schemas describe what is accepted (validation); the others what kvpolicy writes."""


def render(model: type[BaseModel]) -> str:
    mode: Literal["validation", "serialization"] = "validation" if model in WRITTEN_BY_PEOPLE else "serialization"
    schema = model.model_json_schema(by_alias=True, mode=mode)
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path) -> None:
    for name, model in SCHEMAS.items():
        (directory / name).write_text(render(model), encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
