"""What the driver reads from the policy, and the edit it makes to it mid-run.

- ``swap_settings``: the policy text with two model blocks' settings exchanged (e.g.
  their priorities), edited in place at the settings' source spans, so the edit is
  the one an operator would make: comments, layout and every other line unchanged.
- ``idle_rule``: the threshold, grace and cooldown of the idle-reclaim rule (a rule
  ``when model.used < SIZE``, shrinking to ``min``), which the analysis of reclaim
  times needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpolicy.lint.load import policy_from_text
from kvpolicy.policy import Policy
from kvpolicy.policy.model import And, Compare, ModelBlock, Rule, SizeLit


class PolicyEditError(ValueError):
    """The policy does not have what the benchmark needs; the message says what."""


def _block(policy: Policy, name: str) -> ModelBlock:
    for block in policy.models:
        if block.name.value == name:
            return block
    raise PolicyEditError(f"{policy.file}: no model block named {name!r} to edit")


def _offset(lines: list[str], line: int, col: int) -> int:
    return sum(len(s) for s in lines[: line - 1]) + col - 1


def swap_settings(text: str, a: str, b: str, fields: tuple[str, ...], file: str = "<policy>") -> str:
    """``text`` with ``fields`` of models ``a`` and ``b`` exchanged; checked by parsing the result."""
    policy = policy_from_text(text, file)
    block_a, block_b = _block(policy, a), _block(policy, b)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for field in fields:
        na, nb = getattr(block_a, field), getattr(block_b, field)
        if na is None or nb is None:
            missing = a if na is None else b
            raise PolicyEditError(f"{file}: model {missing!r} does not set `{field}`; the edit swaps what both set")
        ta = text[_offset(lines, na.span.line, na.span.col) : _offset(lines, na.span.end_line, na.span.end_col)]
        tb = text[_offset(lines, nb.span.line, nb.span.col) : _offset(lines, nb.span.end_line, nb.span.end_col)]
        edits.append((_offset(lines, na.span.line, na.span.col), _offset(lines, na.span.end_line, na.span.end_col), tb))
        edits.append((_offset(lines, nb.span.line, nb.span.col), _offset(lines, nb.span.end_line, nb.span.end_col), ta))
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    edited = policy_from_text(out, file)
    for field in fields:
        before = (getattr(_block(policy, a), field), getattr(_block(policy, b), field))
        after = (getattr(_block(edited, a), field), getattr(_block(edited, b), field))
        assert _value(after[0]) == _value(before[1]) and _value(after[1]) == _value(before[0]), (
            f"swapping {field} of {a!r} and {b!r} did not take: {before} → {after}"
        )
    return out


def _value(node) -> object:
    for attr in ("value", "bytes", "percent"):
        if hasattr(node, attr):
            return getattr(node, attr)
    return node


@dataclass(frozen=True)
class IdleRule:
    name: str
    below: int
    """The rule acts on a tenant whose elastic use is below this many bytes."""
    grace: float
    cooldown: float


def idle_rule(policy: Policy) -> IdleRule:
    """The first rule whose condition needs ``model.used < SIZE`` (alone, or in an ``and``, e.g. beside
    ``model.waiting == 0``) and whose action shrinks to ``min``."""
    for stmt in policy.statements:
        if not isinstance(stmt, Rule) or stmt.shrink_to is None or stmt.shrink_to.kind != "min":
            continue
        parts = stmt.when.operands if isinstance(stmt.when, And) else (stmt.when,)
        for when in parts:
            if (
                isinstance(when, Compare) and when.op == "<" and getattr(when.left, "name", None) == "model.used"
                and isinstance(when.right, SizeLit)
            ):
                return IdleRule(
                    name=stmt.name.value, below=when.right.bytes,
                    grace=stmt.grace.seconds if stmt.grace else 0.0,
                    cooldown=stmt.cooldown.seconds if stmt.cooldown else 0.0,
                )
    raise PolicyEditError(f"{policy.file}: no rule `when model.used < SIZE … shrink to min` (the idle-reclaim rule)")
