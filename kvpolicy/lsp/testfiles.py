"""Navigation between a policy and its tests (``NAME.kvtest.json``, docs/policy-tests.md).

In a test file: an instance id (a key under ``instances``, or an entry of
``remove``) goes to the model block its instance binds — its model is read from
the case's facts and bound by the evaluator's own resolution; a model name in
inline facts likewise; a rule name in ``actions`` goes to the rule; a
``pool_over_max:POOL`` violation to the pool block; ``policy`` and a case's
``facts`` to their files. References go the other way too: from a rule or a
model block (in the policy or in a test) to every test that names it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvpolicy.json_positions import JsonDocument, JsonString, parse
from kvpolicy.lsp.language import ModelBlock, Policy, Rule, Span, binding_block
from kvpolicy.lsp.positions import Pos, Region
from kvpolicy.paths import TEST_SUFFIX

VIOLATION_POOL_PREFIX = "pool_over_max:"


class Sources(Protocol):
    """What navigation reads: open documents first, else the disk."""

    def text(self, path: Path) -> str | None: ...

    def policy_model(self, path: Path) -> Policy | None: ...

    def kvtest_files(self, folder: Path) -> list[Path]: ...


@dataclass(frozen=True)
class Place:
    path: Path
    region: Region
    """In characters of that file's text."""


@dataclass(frozen=True)
class Mention:
    """A string in a test file that names something in its policy."""

    string: JsonString
    kind: str
    """``policy``, ``facts``, ``instance``, ``model``, ``rule`` or ``pool``."""
    case: int | None


@dataclass(frozen=True)
class KvTestFile:
    path: Path
    text: str
    json: JsonDocument

    @property
    def policy_path(self) -> Path | None:
        value = self.json.value.get("policy") if isinstance(self.json.value, dict) else None
        return (self.path.parent / value).resolve() if isinstance(value, str) else None

    def region(self, string: JsonString) -> Region:
        return Region(_pos(self.text, string.start), _pos(self.text, string.end))


def open_kvtest(path: Path, text: str) -> KvTestFile | None:
    document = parse(text)
    return KvTestFile(path, text, document) if document is not None else None


def mentions(test: KvTestFile) -> Iterator[Mention]:
    for s in test.json.strings:
        kind = _kind(s)
        if kind is not None:
            case = s.path[1] if len(s.path) > 1 and s.path[0] == "cases" and isinstance(s.path[1], int) else None
            yield Mention(s, kind, case)


def _kind(s: JsonString) -> str | None:
    path = s.path
    if path == ("policy",) and not s.is_key:
        return "policy"
    if len(path) < 3 or path[0] != "cases":
        return None
    if len(path) == 3 and path[2] == "facts" and not s.is_key:
        return "facts"
    if s.is_key and len(path) >= 2 and path[-2] == "instances" and path[2] in ("expect", "steps"):
        return "instance"
    if not s.is_key and len(path) >= 2 and path[-2] == "remove" and isinstance(path[-1], int):
        return "instance"
    if not s.is_key and path[2] == "facts" and path[-1] == "model" and "instances" in path:
        return "model"
    if not s.is_key and len(path) >= 2 and path[-2] == "actions":
        return "rule"
    if not s.is_key and len(path) >= 2 and path[-2] == "violations" and s.value.startswith(VIOLATION_POOL_PREFIX):
        return "pool"
    return None


def _instance_of(mention: Mention) -> str | None:
    """The instance id a mention is about (for a violation: the instance it is listed under)."""
    if mention.kind == "instance":
        return mention.string.value
    if mention.kind == "pool":
        path = mention.string.path
        return path[-3] if len(path) >= 3 and isinstance(path[-3], str) else None
    return None


class Navigator:
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    # ---- from a test file -------------------------------------------------------------------

    def definition(self, test: KvTestFile, offset: int) -> list[Place]:
        string = test.json.string_at(offset)
        mention = next((m for m in mentions(test) if m.string == string), None) if string else None
        if mention is None:
            return []
        if mention.kind == "policy":
            path = test.policy_path
            return [Place(path, Region(Pos(0, 0), Pos(0, 0)))] if path and path.is_file() else []
        if mention.kind == "facts":
            path = (test.path.parent / mention.string.value).resolve()
            return [Place(path, Region(Pos(0, 0), Pos(0, 0)))] if path.is_file() else []
        target = self._target(test, mention)
        return [target[1]] if target else []

    def _policy(self, test: KvTestFile) -> tuple[Path, Policy] | None:
        path = test.policy_path
        policy = self.sources.policy_model(path) if path else None
        return (path, policy) if path and policy else None

    def _target(self, test: KvTestFile, mention: Mention) -> tuple[tuple[str, object], Place] | None:
        """What the mention names in the policy, as (identity, place)."""
        found = self._policy(test)
        if found is None:
            return None
        path, policy = found
        if mention.kind == "rule":
            rule = next((r for r in policy.rules if r.name.value == mention.string.value), None)
            return (("rule", rule.name.value), Place(path, _header(rule))) if rule else None
        model_name = mention.string.value if mention.kind == "model" else self._model_of(test, mention)
        if model_name is None:
            return None
        block = binding_block(policy, model_name)
        if block is None:
            return None
        if mention.kind == "pool":
            pool_name = mention.string.value.removeprefix(VIOLATION_POOL_PREFIX)
            pool = next((p for p in block.pools if p.name.value == pool_name), None)
            return (("pool", (block.span, pool_name)), Place(path, _header(pool))) if pool else None
        return ("model", block.span), Place(path, _header(block))

    def _model_of(self, test: KvTestFile, mention: Mention) -> str | None:
        instance = _instance_of(mention)
        if instance is None or mention.case is None:
            return None
        return self._case_models(test, mention.case).get(instance)

    def _case_models(self, test: KvTestFile, case: int) -> dict[str, str]:
        """Instance id → model name in the facts a case starts from."""
        try:
            facts: Any = test.json.value["cases"][case]["facts"]
        except (KeyError, IndexError, TypeError):
            return {}
        if isinstance(facts, str):
            text = self.sources.text((test.path.parent / facts).resolve())
            try:
                facts = json.loads(text) if text is not None else None
            except ValueError:
                return {}
        instances = facts.get("instances") if isinstance(facts, dict) else None
        if not isinstance(instances, list):
            return {}
        return {
            i["id"]: i["model"]
            for i in instances
            if isinstance(i, dict) and isinstance(i.get("id"), str) and isinstance(i.get("model"), str)
        }

    # ---- references -----------------------------------------------------------------------------

    def references_from_test(self, test: KvTestFile, offset: int, include_declaration: bool) -> list[Place]:
        string = test.json.string_at(offset)
        mention = next((m for m in mentions(test) if m.string == string), None) if string else None
        if mention is None or mention.kind in ("policy", "facts"):
            return []
        target = self._target(test, mention)
        if target is None or test.policy_path is None:
            return []
        identity, declaration = target
        return self._references(test.policy_path, identity, [declaration] if include_declaration else [])

    def references_from_policy(self, policy_path: Path, policy: Policy, at: Pos, include_declaration: bool) -> list[Place]:
        """References to the model block or rule whose name is at ``at`` in the policy."""
        items: tuple[ModelBlock | Rule, ...] = (*policy.models, *policy.rules)
        for item in items:
            if Region.of_span(item.name.span).contains(at):
                identity = ("rule", item.name.value) if isinstance(item, Rule) else ("model", item.span)
                declaration = [Place(policy_path, _header(item))] if include_declaration else []
                return self._references(policy_path.resolve(), identity, declaration)
        return []

    def _references(self, policy_path: Path, identity: tuple[str, object], found: list[Place]) -> list[Place]:
        for path in self.sources.kvtest_files(policy_path.parent):
            text = self.sources.text(path)
            test = open_kvtest(path, text) if text is not None else None
            if test is None or test.policy_path != policy_path:
                continue
            for mention in mentions(test):
                if mention.kind in ("policy", "facts"):
                    continue
                target = self._target(test, mention)
                if target is not None and target[0] == identity:
                    found.append(Place(path, test.region(mention.string)))
        return found


def _header(node: ModelBlock | Rule | Any) -> Region:
    """The block's keyword and name: where a definition lands."""
    span: Span = node.span.to(node.name.span)
    return Region.of_span(span)


def _pos(text: str, offset: int) -> Pos:
    line = text.count("\n", 0, offset)
    return Pos(line, offset - (text.rfind("\n", 0, offset) + 1))


def kvtest_files_in(folder: Path, also: Callable[[], list[Path]] = list) -> list[Path]:
    """The ``*.kvtest.json`` files in ``folder``, and the open ones from ``also``, each once."""
    found = {p.resolve() for p in folder.glob(f"*{TEST_SUFFIX}") if p.is_file()} if folder.is_dir() else set()
    found |= {p for p in also() if p.parent == folder}
    return sorted(found)
