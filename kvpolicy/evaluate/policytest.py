"""Policy unit tests: ``*.kvtest.json`` files next to a policy (``kvpolicy test``).

A test file names its policy and lists cases. Each case starts from facts (a file
or inline), optionally a saved state, and runs one or more steps: a step may move
time forward (``advance`` seconds), change facts (``set``), and check the
decision (``expect``), exactly or within bounds. Sizes may be written with units
("40 GiB") anywhere a byte count is expected.

```json
{"schema": 1, "policy": "two-models.kvp",
 "cases": [{"name": "idle batch is shrunk after its grace",
            "facts": "two-models.facts.json",
            "steps": [{"set": {"instances": {"batch/0": {"idle_seconds": 90}}},
                       "expect": {"instances": {"batch/0": {"actions": []}}}},
                      {"advance": 31,
                       "expect": {"instances": {"batch/0": {"limit": "4 GiB", "actions": ["idle-reclaim"]}}}}]}]}
```
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, create_model
from pydantic.fields import FieldInfo

from kvpolicy.diagnostics import PolicyError
from kvpolicy.evaluate.decide import PreparedPolicy, evaluate, prepare
from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.facts import Facts, GpuFacts, InstanceFacts, Size
from kvpolicy.facts_io import FactsError, read_facts
from kvpolicy.json_text import POLICY_TEST, CarriesProblems, DocumentInvalid, load_document, read_document_text, render_problems
from kvpolicy.lint.load import load_policy
from kvpolicy.paths import reason
from kvpolicy.units import format_bytes
from kvpolicy.validation import describe


def _expected_kind(value: Any) -> str:
    return "bounds" if isinstance(value, dict) else "exact"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Bounds(_Strict):
    """A size within bounds (either may be left out)."""

    min: Size | None = None
    """At least this many bytes."""
    max: Size | None = None
    """At most this many bytes."""


Expected = Annotated[
    Annotated[Size, Tag("exact")] | Annotated[Bounds, Tag("bounds")],
    Discriminator(_expected_kind),
]
"""Exactly this size (bytes, or a string with a unit), or bounds {"min": ..., "max": ...}."""


class InstanceExpectation(_Strict):
    """Figures of one instance's decision."""

    guarantee: Expected | None = None
    """The elastic memory guaranteed to the instance."""
    limit: Expected | None = None
    """The most elastic memory it may map."""
    target: Expected | None = None
    """What it should hold: guarantee plus its share of the spare, at most the limit."""
    shortfall: bool | None = None
    """Whether its min could not be guaranteed."""
    actions: list[str] | None = None
    """Names of the rules in force on the instance, in any order."""
    violations: list[str] | None = None
    """``pool_over_max:POOL`` or ``reserve_exceeded``, in any order."""


class GpuExpectation(_Strict):
    """Figures of one GPU's decision."""

    elastic_budget: Expected | None = None
    """Capacity minus headroom, other use and reserved, rounded down to the chunk."""
    free: Expected | None = None
    """The elastic budget minus the elastic memory in use."""
    reserved: Expected | None = None
    """Runtime-owned bytes in all (reported pools, and reserves of instances that have not reported)."""


class Expectation(_Strict):
    """What the decision must say, by instance id and GPU id."""

    instances: dict[str, InstanceExpectation] = Field(default_factory=dict)
    """Expectations by instance id."""
    gpus: dict[str, GpuExpectation] = Field(default_factory=dict)
    """Expectations by GPU id."""


def _constrained(field: FieldInfo) -> Any:
    """A field's type with its constraints (pydantic keeps them apart, in ``metadata``)."""
    if not field.metadata:
        return field.annotation
    arguments = (field.annotation, *field.metadata)  # a tuple, not a star in the subscript: Python 3.10
    return Annotated[arguments]


def _patch(model: type[BaseModel], name: str, doc: str) -> type[BaseModel]:
    """``model`` with every field optional, except ``id``: the fields a step may set."""
    fields: dict[str, Any] = {
        field_name: (_constrained(field) | None, Field(None, description=field.description))
        for field_name, field in model.model_fields.items()
        if field_name != "id"
    }
    return create_model(name, __config__=ConfigDict(extra="forbid"), __doc__=doc, **fields)


if TYPE_CHECKING:  # models built at import from the facts' fields: the type checker sees their base

    class InstanceChange(BaseModel): ...

    class GpuChange(BaseModel): ...

else:
    InstanceChange = _patch(InstanceFacts, "InstanceChange", "Fields of an instance's facts to replace (not its id).")
    GpuChange = _patch(GpuFacts, "GpuChange", "Fields of a GPU's facts to replace (not its id).")


class FactChanges(_Strict):
    """Changes to the facts, from this step on."""

    instances: dict[str, InstanceChange] = Field(default_factory=dict)
    """By instance id: the fields to replace."""
    gpus: dict[str, GpuChange] = Field(default_factory=dict)
    """By GPU id: the fields to replace."""
    remove: list[str] = Field(default_factory=list)
    """Instance ids that are gone from this step on."""


class Step(_Strict):
    """One evaluation: move time, change facts, check the decision."""

    advance: float = Field(default=0.0, ge=0)
    """Seconds added to the facts' now before this evaluation."""
    set: FactChanges | None = None
    """Facts to change before this evaluation."""
    expect: Expectation | None = None
    """What the decision after this step must say."""


class Case(_Strict):
    """One test: facts, an optional evaluator state, and steps (or one expectation)."""

    name: str
    """What the case shows; printed with its result."""
    facts: Annotated[
        Annotated[str, Tag("file")] | Annotated[Facts, Tag("inline")],
        Discriminator(lambda value: "file" if isinstance(value, str) else "inline"),
    ]
    """A facts file relative to the test file, or the facts inline (sizes may have units)."""
    state: dict[str, Any] | None = None
    """Evaluator state JSON to start from (docs/state.schema.json); default: none."""
    steps: list[Step] = Field(default_factory=list)
    """Evaluations in order, the state carried from one to the next; none: evaluate once."""
    expect: Expectation | None = None
    """What the decision must say (after the last step, if there are steps)."""


class PolicyTestFile(_Strict):
    """A policy unit test file (NAME.kvtest.json, run by kvpolicy test)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_attribute_docstrings=True)
    schema_: Literal[1] = Field(default=1, alias="schema")
    """The version of this format: 1."""
    policy: str
    """The policy file, relative to the test file."""
    cases: list[Case]
    """The test cases, run in order."""


class TestFileError(CarriesProblems, Exception):
    """A test file that cannot be run (unreadable, malformed, or its policy is invalid); ``problems`` those of
    a malformed one (``kvpolicy.document_codes``)."""

    def __init__(self, message: str, problems: DocumentInvalid | None = None) -> None:
        super().__init__(message)
        self.problems = problems


class TestFileUnreadable(TestFileError):
    """The test file or its policy cannot be read at all (a usage error: exit 2)."""


class CaseResult(BaseModel):
    file: str
    case: str
    passed: bool
    failures: list[str] = Field(default_factory=list)


def run_test_file(path: Path) -> list[CaseResult]:
    """Run every case of one ``.kvtest.json`` file."""
    try:
        spec = load_document(PolicyTestFile, read_document_text(path), path, kind=POLICY_TEST)
    except OSError as exc:
        raise TestFileUnreadable(f"{path}: cannot read it: {reason(exc)}") from None
    except DocumentInvalid as exc:
        raise TestFileError(str(exc), exc) from None
    policy_path = path.parent / spec.policy
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        raise TestFileError(f"{path}: its policy does not load: {exc}") from None
    except OSError as exc:
        raise TestFileUnreadable(f"{path}: cannot read its policy {policy_path}: {reason(exc)}") from None
    prepared = prepare(policy)  # once for every case and step
    results = []
    for case in spec.cases:
        try:
            failures = _run_case(prepared, case, path.parent)
        except FactsError as exc:  # a facts file the case names: each problem on a line of its own
            failures = [f"cannot run: {line}" for line in _first_lines(exc)]
        except ValueError as exc:
            failures = [f"cannot run: {exc}"]
        results.append(CaseResult(file=str(path), case=case.name, passed=not failures, failures=failures))
    return results


def _first_lines(exc: FactsError) -> list[str]:
    """The first line of each of the diagnostics of ``exc`` (its message without them), and the count of the others."""
    return render_problems(exc.diagnostics, exc.more, hints=False).split("\n") if exc.diagnostics else [str(exc)]


def _run_case(policy: PreparedPolicy, case: Case, base: Path) -> list[str]:
    facts = read_facts(base / case.facts) if isinstance(case.facts, str) else case.facts
    facts_data = facts.model_dump(by_alias=True)
    try:
        state = State.model_validate(case.state) if case.state is not None else None
    except ValidationError as exc:
        raise ValueError(f"state: {describe(exc, State)}") from None
    steps = case.steps or [Step(expect=case.expect)]
    if case.steps and case.expect is not None:
        steps = [*steps[:-1], steps[-1].model_copy(update={"expect": case.expect})]
    failures: list[str] = []
    for number, step in enumerate(steps, start=1):
        facts_data = _apply(facts_data, step)
        try:
            facts = Facts.model_validate(facts_data)
        except ValidationError as exc:
            raise ValueError(f"step {number}: the facts it makes are invalid: {describe(exc, Facts)}") from None
        decision, state = evaluate(policy, facts, state)
        if step.expect is not None:
            prefix = f"step {number}: " if len(steps) > 1 else ""
            failures += [prefix + f for f in _check(decision, step.expect)]
    return failures


def _apply(data: dict[str, Any], step: Step) -> dict[str, Any]:
    data = copy.deepcopy(data)
    data["now"] = data.get("now", 0.0) + step.advance
    changes = step.set
    if changes is None:
        return data
    instances = {i["id"]: i for i in data.get("instances", [])}
    for inst_id, fields in changes.instances.items():
        if inst_id not in instances:
            raise ValueError(f"set: no instance {inst_id!r} in the facts" + _known(instances))
        instances[inst_id].update(fields.model_dump(exclude_unset=True))
    gpus = {g["id"]: g for g in data.get("gpus", [])}
    for gpu_id, gpu_fields in changes.gpus.items():
        if gpu_id not in gpus:
            raise ValueError(f"set: no GPU {gpu_id!r} in the facts" + _known(gpus))
        gpus[gpu_id].update(gpu_fields.model_dump(exclude_unset=True))
    for inst_id in changes.remove:
        if inst_id not in instances:
            raise ValueError(f"remove: no instance {inst_id!r} in the facts" + _known(instances))
    data["instances"] = [i for i in data.get("instances", []) if i["id"] not in set(changes.remove)]
    return data


def _known(ids: dict[str, Any]) -> str:
    return f" (it has {', '.join(map(repr, ids))})" if ids else " (it has none)"


def _check(decision: Decision, expect: Expectation) -> list[str]:
    failures: list[str] = []
    for inst_id, want in expect.instances.items():
        try:
            got = decision.instance(inst_id)
        except KeyError:
            failures.append(f"{inst_id}: no such instance in the decision")
            continue
        for name in ("guarantee", "limit", "target"):
            spec = getattr(want, name)
            if spec is not None:
                failures += _compare(f"{inst_id} {name}", getattr(got, name), spec)
        if want.shortfall is not None and got.shortfall != want.shortfall:
            failures.append(f"{inst_id} shortfall: expected {want.shortfall}, got {got.shortfall}")
        if want.actions is not None:
            actual = sorted(a.rule for a in got.actions)
            if actual != sorted(want.actions):
                failures.append(f"{inst_id} actions: expected {sorted(want.actions)}, got {actual}")
        if want.violations is not None:
            actual = sorted(v.kind + (f":{v.pool}" if v.pool else "") for v in got.violations)
            if actual != sorted(want.violations):
                failures.append(f"{inst_id} violations: expected {sorted(want.violations)}, got {actual}")
    for gpu_id, want_gpu in expect.gpus.items():
        try:
            got_gpu = decision.gpu(gpu_id)
        except KeyError:
            failures.append(f"{gpu_id}: no such GPU in the decision")
            continue
        for name in ("elastic_budget", "free"):
            spec = getattr(want_gpu, name)
            if spec is not None:
                failures += _compare(f"{gpu_id} {name}", getattr(got_gpu, name), spec)
        if want_gpu.reserved is not None:
            failures += _compare(f"{gpu_id} reserved", got_gpu.reserved.total, want_gpu.reserved)
    return failures


def _compare(what: str, actual: int, spec: int | Bounds) -> list[str]:
    shown = f"{format_bytes(actual)} ({actual})"
    if isinstance(spec, Bounds):
        low, high = spec.min, spec.max
        if (low is not None and actual < low) or (high is not None and actual > high):
            bounds = f"[{format_bytes(low) if low is not None else '-inf'}, {format_bytes(high) if high is not None else 'inf'}]"
            return [f"{what}: expected within {bounds}, got {shown}"]
        return []
    return [] if actual == spec else [f"{what}: expected {format_bytes(spec)} ({spec}), got {shown}"]

