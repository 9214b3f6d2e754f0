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

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvpolicy.diagnostics import PolicyError
from kvpolicy.evaluate.decide import PreparedPolicy, evaluate, prepare
from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.facts import Facts
from kvpolicy.lint.load import load_policy
from kvpolicy.units import SIZE_UNITS, format_bytes

TEST_SUFFIX = ".kvtest.json"
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*")
_BYTE_FIELDS = {"capacity", "other_used", "used", "mapped", "bytes", "tensor_bytes"}

Bytes = Union[int, str]


class Bounds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min: Bytes | None = None
    max: Bytes | None = None


Expected = Union[Bytes, Bounds]


class InstanceExpectation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    guarantee: Expected | None = None
    limit: Expected | None = None
    target: Expected | None = None
    shortfall: bool | None = None
    actions: list[str] | None = None
    """Names of the rules in force on the instance, in any order."""
    violations: list[str] | None = None
    """``pool_over_max:POOL`` or ``reserve_exceeded``, in any order."""


class GpuExpectation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    elastic_budget: Expected | None = None
    free: Expected | None = None
    reserved: Expected | None = None


class Expectation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instances: dict[str, InstanceExpectation] = Field(default_factory=dict)
    gpus: dict[str, GpuExpectation] = Field(default_factory=dict)


class FactChanges(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instances: dict[str, dict[str, Any]] = Field(default_factory=dict)
    gpus: dict[str, dict[str, Any]] = Field(default_factory=dict)
    remove: list[str] = Field(default_factory=list)
    """Instance ids that are gone from this step on."""


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    advance: float = 0.0
    set: FactChanges | None = None
    expect: Expectation | None = None


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    facts: Union[str, dict[str, Any]]
    state: dict[str, Any] | None = None
    steps: list[Step] = Field(default_factory=list)
    expect: Expectation | None = None


class PolicyTestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal[1] = Field(default=1, alias="schema")
    policy: str
    cases: list[Case]


class TestFileError(Exception):
    """A test file that cannot be run (unreadable, malformed, or its policy is invalid)."""


class CaseResult(BaseModel):
    file: str
    case: str
    passed: bool
    failures: list[str] = Field(default_factory=list)


def run_test_file(path: Path) -> list[CaseResult]:
    """Run every case of one ``.kvtest.json`` file."""
    try:
        spec = PolicyTestFile.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError) as exc:
        raise TestFileError(f"{path}: {_short(exc)}") from None
    policy_path = path.parent / spec.policy
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        raise TestFileError(f"{path}: its policy does not load: {exc}") from None
    except OSError as exc:
        raise TestFileError(f"{path}: cannot read its policy {policy_path}: {exc.strerror}") from None
    prepared = prepare(policy)  # once for every case and step
    results = []
    for case in spec.cases:
        try:
            failures = _run_case(prepared, case, path.parent)
        except (OSError, ValidationError, ValueError) as exc:
            failures = [f"cannot run: {_short(exc)}"]
        results.append(CaseResult(file=str(path), case=case.name, passed=not failures, failures=failures))
    return results


def _run_case(policy: PreparedPolicy, case: Case, base: Path) -> list[str]:
    raw = case.facts if isinstance(case.facts, dict) else json.loads((base / case.facts).read_text(encoding="utf-8"))
    facts_data = _with_bytes(raw)
    state = State.model_validate(case.state) if case.state is not None else None
    steps = case.steps or [Step(expect=case.expect)]
    if case.steps and case.expect is not None:
        steps = [*steps[:-1], steps[-1].model_copy(update={"expect": case.expect})]
    failures: list[str] = []
    for number, step in enumerate(steps, start=1):
        facts_data = _apply(facts_data, step)
        decision, state = evaluate(policy, Facts.model_validate(facts_data), state)
        if step.expect is not None:
            prefix = f"step {number}: " if len(steps) > 1 else ""
            failures += [prefix + f for f in _check(decision, step.expect)]
    return failures


def _apply(data: dict[str, Any], step: Step) -> dict[str, Any]:
    data = json.loads(json.dumps(data))  # a copy
    data["now"] = data.get("now", 0.0) + step.advance
    changes = step.set
    if changes is None:
        return data
    instances = {i["id"]: i for i in data.get("instances", [])}
    for inst_id, fields in changes.instances.items():
        if inst_id not in instances:
            raise ValueError(f"set: no instance {inst_id!r} in the facts")
        instances[inst_id].update(_with_bytes(fields))
    gpus = {g["id"]: g for g in data.get("gpus", [])}
    for gpu_id, fields in changes.gpus.items():
        if gpu_id not in gpus:
            raise ValueError(f"set: no GPU {gpu_id!r} in the facts")
        gpus[gpu_id].update(_with_bytes(fields))
    data["instances"] = [i for i in data.get("instances", []) if i["id"] not in set(changes.remove)]
    return data


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


def _compare(what: str, actual: int, spec: Expected) -> list[str]:
    shown = f"{format_bytes(actual)} ({actual})"
    if isinstance(spec, Bounds):
        low = None if spec.min is None else to_bytes(spec.min)
        high = None if spec.max is None else to_bytes(spec.max)
        if (low is not None and actual < low) or (high is not None and actual > high):
            bounds = f"[{format_bytes(low) if low is not None else '-inf'}, {format_bytes(high) if high is not None else 'inf'}]"
            return [f"{what}: expected within {bounds}, got {shown}"]
        return []
    want = to_bytes(spec)
    return [] if actual == want else [f"{what}: expected {format_bytes(want)} ({want}), got {shown}"]


def to_bytes(value: Bytes) -> int:
    """``"40 GiB"`` or ``42`` → bytes."""
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(value)
    if not match or match.group(2) not in SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (write e.g. \"40 GiB\" or an integer of bytes)")
    return int(Fraction(match.group(1)) * SIZE_UNITS[match.group(2)])


def _with_bytes(data: Any) -> Any:
    """Facts JSON with unit strings in byte fields turned into integers."""
    if isinstance(data, dict):
        return {k: (to_bytes(v) if k in _BYTE_FIELDS and isinstance(v, str) else _with_bytes(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [_with_bytes(v) for v in data]
    return data


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
    return str(exc)


def find_test_files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(path.rglob(f"*{TEST_SUFFIX}")))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(name)
    return found
