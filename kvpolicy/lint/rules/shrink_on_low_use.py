"""KV030 shrink-on-low-use: a `rule` that shrinks while use is low, blind to work waiting for memory.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import And, Attr, Compare, DurationLit, Expr, IntLit, Name, Not, Operand, Or, PercentLit, SizeLit

WAITING_AWARE = frozenset({"model.waiting", "model.idle"})
"""Attributes that see work waiting: an engine with a request waiting is not idle either."""
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


@register
class ShrinkOnLowUse(Check):
    rule = catalogue.SHRINK_ON_LOW_USE

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for rule in ctx.policy.rules:
            if rule.when is None or rule.shrink_to is None or ctx.reported_within(rule):
                continue
            if _attributes(rule.when) & WAITING_AWARE:
                continue
            low = next((c for c in _conjuncts(rule.when) if isinstance(c, Compare) and _bounds_use_from_above(c)), None)
            if low is not None:
                yield self.at(
                    ctx.file, low.span,
                    f"rule {rule.name.value!r} shrinks on low use: a request that needs more than the shrink "
                    "leaves cannot start, so the use stays low and the request waits",
                    f"write `{_text(low)} and model.waiting == 0`, so the shrink ends when work waits for memory",
                )


def _conjuncts(expr: Expr) -> list[Expr]:
    """The parts the whole condition needs: itself, or the operands of its top-level ``and`` chain."""
    if isinstance(expr, And):
        return [part for operand in expr.operands for part in _conjuncts(operand)]
    return [expr]


def _bounds_use_from_above(expr: Compare) -> bool:
    """``model.used < X`` or ``model.used <= X`` (either way round)."""
    if _is_used(expr.left) and expr.op in ("<", "<="):
        return True
    return _is_used(expr.right) and _FLIPPED[expr.op] in ("<", "<=")


def _is_used(operand: Operand) -> bool:
    return isinstance(operand, Attr) and operand.name == "model.used"


def _attributes(expr: Expr) -> set[str]:
    """Every attribute the condition names."""
    if isinstance(expr, Compare):
        return {o.name for o in (expr.left, expr.right) if isinstance(o, Attr)}
    if isinstance(expr, Not):
        return _attributes(expr.operand)
    operands: tuple[Expr, ...] = expr.operands if isinstance(expr, (And, Or)) else ()
    return set().union(*(_attributes(o) for o in operands))


def _text(compare: Compare) -> str:
    """The comparison as the policy wrote it (its literals keep their spelling)."""
    return f"{_operand_text(compare.left)} {compare.op} {_operand_text(compare.right)}"


def _operand_text(operand: Operand) -> str:
    if isinstance(operand, Attr):
        return operand.name
    if isinstance(operand, (SizeLit, PercentLit, DurationLit)):
        return operand.text
    if isinstance(operand, (IntLit, Name)):
        return str(operand.value)
    return f'"{operand.value}"'
