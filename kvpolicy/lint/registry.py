"""The rule registry: every diagnostic kvpolicy can emit has a rule here.

A rule is a class whose code, kebab-case name, severity and docstring are its
whole contract. The docstring has fixed sections (*What it does*, *Why is this
bad?*, *Example*, *Use instead*); ``docs/lint-rules.md`` is generated from them.
Rules with ``phase = "parse"`` are emitted while the text is parsed and built into
a Policy (e.g. an unknown unit leaves no value to check later), those with
``phase = "suppression"`` by the suppression comments; the others check a built
Policy in ``check``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Literal

from kvpolicy.diagnostics import Diagnostic, Severity, Span

if TYPE_CHECKING:
    from kvpolicy.lint.context import LintContext

DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead")
_CODE = re.compile(r"KV\d{3}")
_NAME = re.compile(r"[a-z]+(-[a-z0-9]+)*")

REGISTRY: dict[str, type[Rule]] = {}


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    phase: ClassVar[Literal["parse", "check", "suppression"]] = "check"
    """Who emits it: the parser, the rule's own ``check``, or the suppression comments."""
    suppressible: ClassVar[bool] = True
    """Whether ``# kvpolicy: ignore[CODE] reason`` may silence it."""

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        """Findings of this rule in ``ctx.policy`` (parse-phase rules find nothing here)."""
        return iter(())

    @classmethod
    def at(cls, file: str, span: Span, message: str, hint: str | None = None) -> Diagnostic:
        """A diagnostic of this rule at ``span`` of ``file``."""
        return Diagnostic(
            file=file,
            line=span.line,
            col=span.col,
            end_line=span.end_line,
            end_col=span.end_col,
            code=cls.code,
            name=cls.name,
            severity=cls.severity,
            message=message,
            hint=hint,
        )

    @classmethod
    def summary(cls) -> str:
        return inspect.getdoc(cls).splitlines()[0]

    @classmethod
    def anchor(cls) -> str:
        """The rule's anchor in docs/lint-rules.md: GitHub's for the heading ``KV001 unknown-unit``."""
        return f"{cls.code.lower()}-{cls.name}"

    @classmethod
    def sections(cls) -> dict[str, str]:
        """The docstring's sections by heading (``## What it does`` ...), stripped."""
        doc = inspect.getdoc(cls) or ""
        parts = re.split(r"^## (.+)$", doc, flags=re.M)
        return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: add a rule to the registry, checking its metadata."""
    if not _CODE.fullmatch(cls.code):
        raise ValueError(f"{cls.__name__}: code {cls.code!r} is not KVnnn")
    if not _NAME.fullmatch(cls.name):
        raise ValueError(f"{cls.__name__}: name {cls.name!r} is not kebab-case")
    for other in REGISTRY.values():
        if other.code == cls.code or other.name == cls.name:
            raise ValueError(f"{cls.__name__} reuses the code or name of {other.__name__}")
    REGISTRY[cls.code] = cls
    return cls


def all_rules() -> list[type[Rule]]:
    """Every registered rule, by code."""
    import kvpolicy.lint.rules  # noqa: F401  (registers them)

    return [REGISTRY[code] for code in sorted(REGISTRY)]


def rule_by_code(code: str) -> type[Rule] | None:
    all_rules()
    return REGISTRY.get(code)
