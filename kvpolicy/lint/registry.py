"""The checks: one class per ``check``-phase rule of the catalogue.

A rule's identity and documentation are in ``kvpolicy.catalogue``; a check is the
code that finds that rule's diagnostics in a built Policy. Each lives in its own
module of ``kvpolicy/lint/rules/`` and is registered with ``@register``; that
package lists them all (``kvpolicy.lint.rules.all_checks``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from kvpolicy.catalogue import CHECK, Rule, rule_by_code
from kvpolicy.diagnostics import Diagnostic, Span

if TYPE_CHECKING:
    from kvpolicy.lint.context import LintContext

CHECKS: dict[str, type[Check]] = {}
"""Every registered check, by its rule's code."""


class Check:
    """Finds the diagnostics of ``rule`` in a built policy."""

    rule: ClassVar[Rule]

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        raise NotImplementedError

    def at(self, file: str, span: Span, message: str, hint: str | None = None) -> Diagnostic:
        """A diagnostic of this check's rule at ``span`` of ``file``."""
        return self.rule.at(file, span, message, hint)


def register(cls: type[Check]) -> type[Check]:
    """Class decorator: add a check for a catalogue rule of the ``check`` phase."""
    rule = getattr(cls, "rule", None)
    if not isinstance(rule, Rule) or rule_by_code(rule.code) is not rule:
        raise ValueError(f"{cls.__name__}: its rule is not in kvpolicy.catalogue")
    if rule.phase != CHECK:
        raise ValueError(f"{cls.__name__}: {rule.code} is reported in the {rule.phase} phase, not by a check")
    if rule.code in CHECKS:
        raise ValueError(f"{cls.__name__}: {rule.code} already has a check ({CHECKS[rule.code].__name__})")
    CHECKS[rule.code] = cls
    return cls
