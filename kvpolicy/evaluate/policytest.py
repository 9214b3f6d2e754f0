"""Policy unit tests: ``*.kvtest.json`` files next to a policy (``kvpolicy test``).

A test file names its policy and lists cases. Each case starts from facts (a file
or inline), optionally a saved state, and runs one or more steps: a step may move
time forward (``advance`` seconds), change facts (``set``), and check the
decision (``expect``), exactly or within bounds. Sizes may be written with units
("40 GiB") anywhere a byte count is expected. A case that cannot run (a state that is no
evaluator state, an id a step names that the facts lack, facts a step makes invalid, a facts
file with problems) fails with its problems, each placed with its code as the file's own are;
the other cases still run.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SkipValidation,
    Tag,
    ValidationError,
    create_model,
)
from pydantic.fields import FieldInfo

from kvpolicy.diagnostics import Diagnostic, PolicyError
from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_DOCUMENT, DocumentCode
from kvpolicy.evaluate.decide import PreparedPolicy, evaluate, prepare
from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.facts import Facts, GpuFacts, InstanceFacts, Size
from kvpolicy.facts_io import FactsError, FactsUnreadable, read_facts
from kvpolicy.json_text import (
    FACTS,
    POLICY_TEST,
    PROBLEM_CODES,
    STATE,
    CarriesProblems,
    DocumentInvalid,
    DocumentKind,
    Places,
    load_document,
    read_document_text,
    refused,
    render_problems,
    wrong_document,
)
from kvpolicy.lint.load import load_policy
from kvpolicy.paths import reason
from kvpolicy.suggest import closest
from kvpolicy.units import format_bytes
from kvpolicy.validation import Problem, problems


M = TypeVar("M", bound=BaseModel)


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
    # Inline facts are validated when the case runs (``_case_facts``), so that their problems fail this case
    # alone, as a facts file's do; the schema still describes them as facts, for editors.
    facts: Annotated[
        Annotated[str, Tag("file")] | Annotated[Facts, SkipValidation, Tag("inline")],
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
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    """The problems that stopped the case (in the test file or its facts file), each at its place; their first
    lines are its failures."""
    more: int = 0
    """How many problems past those shown stopped it."""


def run_test_file(path: Path) -> list[CaseResult]:
    """Run every case of one ``.kvtest.json`` file."""
    try:
        text = read_document_text(path)
        spec = load_document(PolicyTestFile, text, path, kind=POLICY_TEST)
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
    places = Places(text)
    return [_result(prepared, case, _Where(str(path), places, ("cases", str(index))), path)
            for index, case in enumerate(spec.cases)]


def _result(policy: PreparedPolicy, case: Case, where: _Where, path: Path) -> CaseResult:
    """One case run, or the problems that stopped it: each problem's first line a failure of its own."""
    try:
        failures = _run_case(policy, case, path.parent, where)
    except (FactsError, DocumentInvalid) as exc:  # placed problems: in the test file, or a facts file it names
        if not exc.diagnostics:
            return CaseResult(file=str(path), case=case.name, passed=False, failures=[f"cannot run: {exc}"])
        lines = render_problems(exc.diagnostics, exc.more, hints=False).split("\n")
        return CaseResult(file=str(path), case=case.name, passed=False, failures=[f"cannot run: {line}" for line in lines],
                          diagnostics=list(exc.diagnostics), more=exc.more)
    except ValueError as exc:
        failures = [f"cannot run: {exc}"]
    return CaseResult(file=str(path), case=case.name, passed=not failures, failures=failures)


@dataclass(frozen=True)
class _Where:
    """Where a case, or a step of it, is in its test file (``places``: the file's text, read for positions only
    when a problem is placed): a problem is named by its path from the top."""

    file: str
    places: Places
    path: tuple[str, ...]

    def below(self, *parts: str) -> _Where:
        return _Where(self.file, self.places, (*self.path, *parts))

    def problem(self, code: DocumentCode, path: Sequence[str], message: str, hint: str | None = None, *,
                key: bool = False, missing: bool = False) -> Diagnostic:
        """``code``'s diagnostic at ``path`` below here (``key``: at its key; ``missing``: at the ``{`` of the
        object that lacks the field ``path`` ends with), its message ``PATH: message``."""
        full = (*self.path, *path)
        return code.at(self.file, *self.places.place(full, key=key, missing=missing), f"{'.'.join(full)}: {message}",
                       hint)


def _run_case(policy: PreparedPolicy, case: Case, base: Path, where: _Where) -> list[str]:
    facts = _case_facts(case.facts, base, where)
    facts_data = facts.model_dump(by_alias=True)
    state = _state(case.state, where.below("state"))
    steps = case.steps or [Step(expect=case.expect)]
    if case.steps and case.expect is not None:
        steps = [*steps[:-1], steps[-1].model_copy(update={"expect": case.expect})]
    failures: list[str] = []
    removed: dict[str, int] = {}  # instance id → the step that removed it, to say so if a later step names it
    for number, step in enumerate(steps, start=1):
        at = where.below("steps", str(number - 1)) if case.steps else where  # one step made up: the case is its place
        facts_data = _apply(facts_data, step, at, removed)
        if step.set is not None:
            removed.update((inst_id, number) for inst_id in step.set.remove if inst_id not in removed)
        facts = _facts(facts_data, step, at)
        decision, state = evaluate(policy, facts, state)
        if step.expect is not None:
            prefix = f"step {number}: " if len(steps) > 1 else ""
            failures += [prefix + f for f in _check(decision, step.expect)]
    return failures


def _case_facts(given: object, base: Path, at: _Where) -> Facts:
    """The case's facts: inline (``DocumentInvalid`` with their problems, each at its place in the test file), or
    the file it names (relative to the test file); one that cannot be read at all is a problem at its name in the
    test file, one with problems a ``FactsError`` with them."""
    if not isinstance(given, str):  # inline: as written, validated here (``Case.facts``)
        return _validated(Facts, FACTS, given, at.below("facts"))
    try:
        return read_facts(base / given)
    except FactsUnreadable as exc:
        raise refused([at.problem(VALUE_NOT_ALLOWED, ("facts",), f"cannot read {given!r}: {exc.why}",
                                  "a case's facts path is relative to the test file's folder")]) from None


def _state(given: dict[str, Any] | None, at: _Where) -> State | None:
    """The case's starting state; ``DocumentInvalid`` with its problems, each at its place in the test file."""
    return None if given is None else _validated(State, STATE, given, at)


def _validated(model: type[M], kind: DocumentKind, given: object, at: _Where) -> M:
    """``given``, a document of ``kind`` written inside the test file at ``at``, as ``model``; ``DocumentInvalid``
    with its problems, each at its place in the test file."""
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        wrong = wrong_document(exc, given, kind)  # another schema version, or another kind of document
        if wrong is not None:
            path, message, hint = wrong
            raise refused([at.problem(WRONG_DOCUMENT, path, message, hint)]) from None
        described = f"kvpolicy schema {kind.schema} describes every field"
        raise refused(at.problem(PROBLEM_CODES[p.kind], p.path, _said(p), p.hint or described, key=p.is_key,
                                 missing=p.kind == "missing-field") for p in problems(exc, model)) from None


def _said(problem: Problem) -> str:
    """What ``problem`` says of its value, without the path its message starts with."""
    for prefix in (".".join(problem.path) + ": ", "(top level): "):
        if problem.message.startswith(prefix):
            return problem.message[len(prefix):]
    return problem.message


def _apply(data: dict[str, Any], step: Step, at: _Where, removed: Mapping[str, int]) -> dict[str, Any]:
    """The facts ``data`` after ``step``; ``DocumentInvalid`` at each id its ``set`` names that they do not have
    (``removed``: the instances earlier steps removed, by step number)."""
    data = copy.deepcopy(data)
    data["now"] = data.get("now", 0.0) + step.advance
    changes = step.set
    if changes is None:
        return data
    instances = {i["id"]: i for i in data.get("instances", [])}
    gpus = {g["id"]: g for g in data.get("gpus", [])}
    unknown = [*_unknown_ids(changes.instances, instances, "instance", at.below("set", "instances"), removed),
               *_unknown_ids(changes.gpus, gpus, "GPU", at.below("set", "gpus"), {})]
    unknown += [at.problem(VALUE_NOT_ALLOWED, ("set", "remove", str(n)), *_absent(inst_id, instances, "instance", removed))
                for n, inst_id in enumerate(changes.remove) if inst_id not in instances]
    if unknown:
        raise refused(unknown)
    for inst_id, fields in changes.instances.items():
        instances[inst_id].update(fields.model_dump(exclude_unset=True))
    for gpu_id, gpu_fields in changes.gpus.items():
        gpus[gpu_id].update(gpu_fields.model_dump(exclude_unset=True))
    data["instances"] = [i for i in data.get("instances", []) if i["id"] not in set(changes.remove)]
    return data


def _unknown_ids(named: Iterable[str], known: dict[str, Any], what: str, at: _Where,
                 removed: Mapping[str, int]) -> list[Diagnostic]:
    """A diagnostic at each key of ``named`` (``set``'s ids of a ``what``) that is not a ``what`` of the facts."""
    return [at.problem(VALUE_NOT_ALLOWED, (ident,), *_absent(ident, known, what, removed), key=True)
            for ident in named if ident not in known]


def _absent(ident: str, known: dict[str, Any], what: str, removed: Mapping[str, int]) -> tuple[str, str]:
    """The message and hint for ``ident``, a ``what`` the facts lack: an earlier step's removal, or a likely typo."""
    if ident in removed:
        return (f"no {what} {ident!r} in the facts: step {removed[ident]} removed it",
                f"a step's `remove` takes the {what} out of the facts for every later step")
    return f"no {what} {ident!r} in the facts", _known(ident, known, what)


def _known(ident: str, known: dict[str, Any], what: str) -> str:
    guess = closest(ident, known)
    if guess is not None:
        return f"did you mean {guess!r}?"
    return f"the {what}s of the facts: {', '.join(map(repr, known))}" if known else f"the facts have no {what}s"


def _facts(data: dict[str, Any], step: Step, at: _Where) -> Facts:
    """``data`` as facts; ``DocumentInvalid`` for a problem ``step`` made, at the value of its that made it."""
    try:
        return Facts.model_validate(data)
    except ValidationError as exc:
        raise refused(_made_invalid(p, data, step, at) for p in problems(exc, Facts)) from None


def _made_invalid(problem: Problem, data: dict[str, Any], step: Step, at: _Where) -> Diagnostic:
    """``problem`` of the facts ``step`` made, at the value of its ``set`` it comes from (in that value's words),
    else at its ``advance`` (for ``now``) or the step itself, with the facts' path."""
    code, key, missing = PROBLEM_CODES[problem.kind], problem.is_key, problem.kind == "missing-field"
    written = _written(problem.path, data, step)
    if written is not None:
        return at.problem(code, written, _said(problem), problem.hint, key=key, missing=missing)
    place = ("advance",) if problem.path[:1] == ("now",) and "advance" in step.model_fields_set else ()
    return at.problem(code, place, f"the facts it makes are invalid: {problem.message}", problem.hint)


def _written(path: tuple[str, ...], data: dict[str, Any], step: Step) -> tuple[str, ...] | None:
    """Where in ``step`` the value at ``path`` of the facts it made was written (``set.instances.ID.FIELD...``),
    or None if the step did not set it."""
    if step.set is None or len(path) < 3 or path[0] not in ("instances", "gpus") or not path[1].isdigit():
        return None
    entries = data.get(path[0], [])
    if int(path[1]) >= len(entries):
        return None
    ident = entries[int(path[1])]["id"]
    changes = getattr(step.set, path[0]).get(ident)
    if changes is None or path[2] not in changes.model_fields_set:
        return None
    return ("set", path[0], ident, *path[2:])


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

