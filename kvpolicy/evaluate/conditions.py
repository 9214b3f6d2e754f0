"""``when`` expressions compiled to closures over a GPU's and an instance's figures.

A rule's condition is evaluated for every instance on every evaluation, so it is
compiled once per (rule, GPU capacity) into plain closures: no AST walking and
no percentage arithmetic on the hot path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from kvpolicy.policy import model as m

Figures = Mapping[str, Any]
"""``gpu.free`` → bytes, ``model.idle`` → seconds, ``model.engine`` → str, ..."""
Condition = Callable[[Figures], bool]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def compile_condition(expr: m.Expr, capacity: int) -> Condition:
    """A function of the figures that is true where ``expr`` holds (percentages of ``capacity``)."""
    if isinstance(expr, m.Compare):
        return _compare(expr, capacity)
    if isinstance(expr, m.Not):
        inner = compile_condition(expr.operand, capacity)
        return lambda f: not inner(f)
    parts = [compile_condition(e, capacity) for e in expr.operands]
    if isinstance(expr, m.And):
        if len(parts) == 2:
            a, b = parts
            return lambda f: a(f) and b(f)
        return lambda f: all(p(f) for p in parts)
    if len(parts) == 2:
        a, b = parts
        return lambda f: a(f) or b(f)
    return lambda f: any(p(f) for p in parts)


def _compare(expr: m.Compare, capacity: int) -> Condition:
    op = _OPS[expr.op]
    left, right = expr.left, expr.right
    if isinstance(left, m.Attr) and isinstance(right, m.Attr):
        a, b = left.name, right.name
        return lambda f: op(f[a], f[b])
    if isinstance(left, m.Attr):
        a, value = left.name, _constant(right, capacity)
        return lambda f: op(f[a], value)
    assert isinstance(right, m.Attr), "the builder guarantees an attribute on one side"
    b, value = right.name, _constant(left, capacity)
    return lambda f: op(value, f[b])


def _constant(node: m.Operand, capacity: int) -> Any:
    if isinstance(node, (m.SizeLit, m.PercentLit)):
        return node.resolve(capacity)
    if isinstance(node, m.DurationLit):
        return node.seconds
    if isinstance(node, m.IntLit):
        return node.value
    assert isinstance(node, (m.Str, m.Name)), f"unexpected operand {type(node).__name__}"
    return node.value
