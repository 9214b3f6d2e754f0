"""One analysed version of an open policy: its diagnostics, outline and policy model."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kvpolicy.lsp.context import CheckContext
from kvpolicy.lsp.language import Linted, Policy, StatementCache, declared_capacity, lint
from kvpolicy.lsp.scan import Outline, scan
from kvpolicy.paths import POLICY_SUFFIX, TEST_SUFFIX


def is_policy(uri: str) -> bool:
    return uri.endswith(POLICY_SUFFIX)


def is_test_file(uri: str) -> bool:
    return uri.endswith(TEST_SUFFIX)


@dataclass
class PolicyDocument:
    uri: str
    path: Path | None
    """The file on disk, for a ``file:`` document."""
    version: int | None
    text: str
    context: CheckContext
    linted: Linted

    @property
    def file(self) -> str:
        return str(self.path) if self.path else self.uri

    @cached_property
    def outline(self) -> Outline:
        return scan(self.text)

    @cached_property
    def model(self) -> Policy | None:
        """The policy model, built even when the text has errors (for hover and navigation)."""
        return self.linted.policy or self.linted.partial


def analyse(
    uri: str, path: Path | None, version: int | None, text: str, context: CheckContext,
    statements: StatementCache | None = None,
) -> PolicyDocument:
    """Lint ``text`` against ``context``; with no facts and no capacity given, against the
    capacity the policy declares for its GPUs (a second pass, only for such a policy).
    ``statements``: the document's cache of what its last version built (see ``lint``)."""
    file = str(path) if path else uri
    linted = lint(text, file, gpu_capacity=context.gpu_capacity, facts=context.facts, statements=statements)
    if context.facts is None and context.gpu_capacity is None and linted.policy is not None and "capacity" in text:
        capacity = declared_capacity(linted.policy)
        if capacity is not None:
            context = CheckContext(gpu_capacity=capacity, capacity_from="the policy's gpu blocks")
            linted = lint(text, file, gpu_capacity=capacity, syntax=linted.syntax, statements=statements)  # not parsed again
    return PolicyDocument(uri, path, version, text, context, linted)
