"""JSON Schemas of the documents that cross a boundary, as published under docs/.

``python -m kvpolicy.evaluate.schemas`` writes them (``--check``: exit 1 if one is stale;
``kvpolicy schema NAME`` prints one); a test fails when the files under docs/ differ from what
the models say. Documents
people write (facts, ``.kvtest.json`` files) are described as they may be written (sizes as
integers or strings with a unit); documents kvpolicy writes, as it writes them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from kvpolicy import generated
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


def main(argv: Sequence[str] | None = None) -> int:
    docs = generated.REPOSITORY / "docs"
    return generated.main("kvpolicy.evaluate.schemas", __doc__,
                          lambda: {docs / name: render(model) for name, model in SCHEMAS.items()}, argv)


if __name__ == "__main__":
    sys.exit(main())
