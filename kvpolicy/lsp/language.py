"""Everything the language server needs from the language layers, in one place.

The server reaches ``kvpolicy.policy``, ``kvpolicy.lint`` and ``kvpolicy.evaluate``
only through this module: linting, formatting, the rule docs, the policy model and
how a model name binds a block. When those layers move things around, this is the
one file to re-point. Base-layer modules (units, engines, diagnostics, facts) are
imported directly where they are used.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache

from kvpolicy.diagnostics import Diagnostic, PolicyError, Span
from kvpolicy.facts import Facts
from kvpolicy.lint.engine import lint_text
from kvpolicy.lint.source import check_size
from kvpolicy.catalogue import all_rules, rule_by_code
from kvpolicy.lint.report import RULES_DOC
from kvpolicy.policy import globs, vocabulary
from kvpolicy.policy.build import BLOCK_FIELDS, PolicyBuilder
from kvpolicy.policy.fmt import format_text
from kvpolicy.policy.incremental import StatementCache
from kvpolicy.policy.model import ModelBlock, Policy, Rule
from kvpolicy.policy.resolve import bind, gpu_settings
from kvpolicy.policy.syntax import SyntaxResult, parse_tree

RULES_DOC_URL = RULES_DOC
"""docs/lint-rules.md in the repository; a rule's section is ``RULES_DOC_URL#anchor``.
Defined once, in ``kvpolicy.lint.report`` (the SARIF output links the same pages)."""

__all__ = [
    "BLOCK_FIELDS", "Diagnostic", "FormatRefused", "Linted", "ModelBlock", "Policy", "RULES_DOC_URL", "Rule", "RuleDoc", "Span",
    "StatementCache",
    "binding_block", "declared_capacity", "format_policy", "gpu_capacity", "lint", "matches", "partial_policy",
    "rule_doc", "rule_docs", "vocabulary",
]


@dataclass(frozen=True)
class Linted:
    diagnostics: tuple[Diagnostic, ...]
    policy: Policy | None
    """The checked policy; None when the text has an error."""
    partial: Policy | None = None
    """The policy model built even when the text has errors (``partial_policy``'s, without parsing again)."""
    syntax: SyntaxResult | None = None
    """The parse, for linting the same text again against another context."""


def lint(
    text: str, file: str, *, gpu_capacity: int | None = None, facts: Facts | None = None,
    syntax: SyntaxResult | None = None, statements: StatementCache | None = None,
) -> Linted:
    """Every diagnostic of ``text``, as ``kvpolicy lint`` reports them (from ``syntax``, this
    text's parse, when a first pass made it). With ``statements``, the document's cache, only
    the statements changed since its last lint are parsed and built (then ``syntax`` stays None)."""
    if syntax is None:
        try:
            check_size(text.encode("utf-8"), file)  # before parsing: an editor can hold anything
        except PolicyError as exc:
            return Linted(exc.diagnostics, None)
        if statements is None:
            syntax = parse_tree(text, file)
    result = lint_text(text, file, gpu_capacity=gpu_capacity, facts=facts, syntax=syntax, statements=statements)
    return Linted(result.diagnostics, result.policy, result.partial, syntax)


def partial_policy(text: str, file: str) -> Policy | None:
    """The policy model of ``text`` even when it has errors (what parsed and built),
    for navigation and hover; None when nothing could be parsed. Never for deciding."""
    syntax = parse_tree(text, file)
    if syntax.tree is None:
        return None
    lines = text.split("\n")
    end = Span.point(len(lines), len(lines[-1]) + 1)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return PolicyBuilder(file).policy(syntax.tree, digest, end)


class FormatRefused(Exception):
    """The text has a syntax error: ``diagnostic`` is the first."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.render())
        self.diagnostic = diagnostic


def format_policy(text: str, file: str) -> str:
    """``kvpolicy fmt``'s output for ``text``; raises FormatRefused on a syntax error."""
    try:
        return format_text(text, file)
    except PolicyError as exc:
        raise FormatRefused(exc.first) from None


@dataclass(frozen=True)
class RuleDoc:
    code: str
    name: str
    severity: str
    suppressible: bool
    summary: str
    sections: dict[str, str]
    """The rule's docstring sections (What it does, Why is this bad?, Example, Use instead)."""
    href: str
    """Its section of docs/lint-rules.md."""


@cache
def rule_doc(code: str) -> RuleDoc | None:
    rule = rule_by_code(code)
    if rule is None:
        return None
    return RuleDoc(
        code=rule.code,
        name=rule.name,
        severity=rule.severity.value,
        suppressible=rule.suppressible,
        summary=rule.summary(),
        sections=rule.sections(),
        href=f"{RULES_DOC_URL}#{rule.anchor()}",
    )


def rule_docs() -> list[RuleDoc]:
    """Every rule, by code."""
    return [doc for doc in (rule_doc(rule.code) for rule in all_rules()) if doc is not None]


def binding_block(policy: Policy, model_name: str) -> ModelBlock | None:
    """The model block an instance of ``model_name`` binds (the evaluator's resolution)."""
    return bind(policy, model_name)


def matches(pattern: str, model_name: str) -> bool:
    return globs.matches(pattern, model_name)


def gpu_capacity(policy: Policy, gpu_id: str) -> int | None:
    """The ``capacity`` the policy gives GPU ``gpu_id`` (its block, else ``gpu *``), if any."""
    return gpu_settings(policy, gpu_id).capacity


def declared_capacity(policy: Policy) -> int | None:
    """A capacity to check the policy against when nothing else gives one: the
    policy's own, when its ``gpu`` blocks give one to every GPU they name (or to ``gpu *``)."""
    ids = sorted({i.value for g in policy.gpus for i in g.ids}) or ["*"]
    capacities = [gpu_capacity(policy, gpu_id) for gpu_id in ids]
    return capacities[0] if capacities and all(c is not None for c in capacities) else None
