"""Parse tree → typed Policy, checking every value on the way.

The builder is an explicit function per tree node (no ``children[n]`` guessing
in the checks that follow): it classifies each QUANTITY token by its unit,
resolves attributes, types comparisons, and reports what cannot be built
(unknown units, fields and attributes, values of the wrong kind, settings given
twice). What it cannot build it leaves out, so later checks see a valid model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from lark import Tree

from kvpolicy.catalogue import (
    DUPLICATE_DEFINITION,
    INVALID_DURATION,
    INVALID_VALUE,
    OUT_OF_RANGE,
    UNKNOWN_ATTRIBUTE,
    UNKNOWN_FIELD,
    UNKNOWN_UNIT,
    Rule,
)
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.policy import model as m
from kvpolicy.policy import vocabulary as v
from kvpolicy.policy.lark_parser import Token
from kvpolicy.suggest import closest, did_you_mean
from kvpolicy.units import DURATION_UNITS, SIZE_UNITS, duration_seconds, size_bytes

_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))[ \t]*(%|[A-Za-z_][A-Za-z0-9_]*)?")
MAX_DIGITS = 30
"""Longer numbers are refused before conversion (no size needs 30 digits)."""

_BLOCK_NAMES = {
    "defaults": "defaults",
    "gpu": "gpu",
    "model": "model",
    "pool": "pool",
    "rule": "rule",
}


VALUE_TOKENS = frozenset({"QUANTITY", "STRING", "NAME", "ATTRIBUTE", "COMPARE", "STAR"})


def args(tree: Tree) -> list[Tree | Token]:
    """A node's operands: subtrees and value tokens, without keywords, braces and separators."""
    return [c for c in tree.children if isinstance(c, Tree) or c.type in VALUE_TOKENS]


# The grammar says which operands are tokens and which are nodes; these say it to the
# type checker, and refuse a tree that breaks it (a grammar change the builder missed).


def _as_token(tree: Tree, node: Tree | Token) -> Token:
    if isinstance(node, Tree):
        raise TypeError(f"the grammar has a token among the operands of {tree.data!r}, not a {node.data!r} node")
    return node


def _as_tree(tree: Tree, node: Tree | Token) -> Tree:
    if not isinstance(node, Tree):
        raise TypeError(f"the grammar has a node among the operands of {tree.data!r}, not a {node.type} token")
    return node


def token_arg(tree: Tree, index: int = 0) -> Token:
    """Operand ``index`` of ``tree``, where the grammar puts a token (a value, a name, a word)."""
    return _as_token(tree, args(tree)[index])


def tree_arg(tree: Tree, index: int = 0) -> Tree:
    """Operand ``index`` of ``tree``, where the grammar puts a node (a selector, a condition)."""
    return _as_tree(tree, args(tree)[index])


def token_args(tree: Tree) -> list[Token]:
    """The operands of ``tree``, all tokens in the grammar."""
    return [_as_token(tree, node) for node in args(tree)]


def tree_args(tree: Tree) -> list[Tree]:
    """The operands of ``tree``, all nodes in the grammar (statements, conditions)."""
    return [_as_tree(tree, node) for node in args(tree)]


def first_token(node: Tree | Token) -> Token:
    while isinstance(node, Tree):
        node = node.children[0]
    return node


def last_token(node: Tree | Token) -> Token:
    while isinstance(node, Tree):
        node = node.children[-1]
    return node


def _kind(tree: Tree) -> str:
    """The rule name of a tree node as a plain string (Lark's is a Token, whose
    comparisons run in Python: slow in the builder's hot loops)."""
    data = tree.data
    return data.value if isinstance(data, Token) else data


def span_of(node: Tree | Token) -> Span:
    """From the first token of ``node`` to the end of its last (separators excluded)."""
    if isinstance(node, Token):
        return Span(line=node.line, col=node.column, end_line=node.end_line, end_col=node.end_column)
    first = first_token(node)
    last = last_token(node)
    return Span(line=first.line, col=first.column, end_line=last.end_line, end_col=last.end_column)


class _Quantity:
    """A QUANTITY token split into its exact number and its unit."""

    __slots__ = ("token", "number_text", "number", "unit", "span", "unit_start")

    def __init__(self, token: Token, number_text: str, number: int | Fraction, unit: str | None, unit_start: int) -> None:
        self.token = token
        self.number_text = number_text
        self.number = number
        self.unit = unit
        self.span = span_of(token)
        self.unit_start = unit_start

    @property
    def unit_span(self) -> Span:
        """Where the unit is (for an unknown unit: most quantities never need it)."""
        col = self.token.column + self.unit_start
        return Span(line=self.token.line, col=col, end_line=self.token.line, end_col=self.token.end_column)


@dataclass(frozen=True)
class Built:
    """One top-level statement as built: a block, or the number of a ``version`` statement."""

    node: m.Statement | None
    """The block; None for ``version``, or when it could not be built (or is not a block)."""
    version: m.IntLit | None
    """A ``version`` statement's number, when it could be built."""
    version_span: Span | None
    """A ``version`` statement's span (None for every other statement)."""
    diagnostics: tuple[Diagnostic, ...]
    """What building it reported."""


def assemble(file: str, built: Iterable[Built], sha256: str, end: Span) -> tuple[m.Policy, list[Diagnostic]]:
    """The policy of these statements (in file order), and every diagnostic of building them."""
    version: m.IntLit | None = None
    has_version_statement = False
    statements: list[m.Statement] = []
    diagnostics: list[Diagnostic] = []
    for item in built:
        diagnostics.extend(item.diagnostics)
        if item.version_span is not None:
            has_version_statement = True
            if version is not None:
                diagnostics.append(DUPLICATE_DEFINITION.at(
                    file, item.version_span, "'version' is given twice",
                    f"remove one (the first is on line {version.span.line})",
                ))
            elif item.version is not None:
                version = item.version
        elif item.node is not None:
            statements.append(item.node)
    policy = m.Policy(
        span=Span(line=1, col=1, end_line=end.line, end_col=end.col),
        file=file,
        sha256=sha256,
        version=version,
        has_version_statement=has_version_statement,
        statements=tuple(statements),
    )
    return policy, diagnostics


class PolicyBuilder:
    """Builds one Policy; ``diagnostics`` collects what could not be built."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.diagnostics: list[Diagnostic] = []

    def report(self, rule: Rule, node: Tree | Token | Span, message: str, hint: str | None = None) -> None:
        span = node if isinstance(node, Span) else span_of(node)
        self.diagnostics.append(rule.at(self.file, span, message, hint))

    # ---- top level --------------------------------------------------------------

    def policy(self, tree: Tree, sha256: str, end: Span) -> m.Policy:
        policy, diagnostics = assemble(self.file, self.statements(tree), sha256, end)
        self.diagnostics.extend(diagnostics)
        return policy

    def statements(self, tree: Tree) -> list[Built]:
        """Each top-level statement of ``tree`` built on its own (``assemble`` makes the policy)."""
        return [self.statement(child) for child in tree_args(tree)]

    def statement(self, child: Tree) -> Built:
        """One top-level statement, with what building it reported."""
        before = len(self.diagnostics)
        kind = _kind(child)
        node: m.Statement | None = None
        if kind == "version":
            number = self.integer(token_arg(child), "version")
            return Built(None, number, span_of(child), self._taken(before))
        if kind == "defaults":
            node = self.defaults(child)
        elif kind == "gpu":
            node = self.gpu(child)
        elif kind == "model":
            node = self.model(child)
        elif kind == "rule":
            node = self.rule(child)
        else:
            self.unknown(child, None)
        return Built(node, None, None, self._taken(before))

    def _taken(self, before: int) -> tuple[Diagnostic, ...]:
        """What was reported since ``before``, taken out of ``diagnostics`` (a ``Built`` carries it)."""
        taken = tuple(self.diagnostics[before:])
        del self.diagnostics[before:]
        return taken

    def unknown(self, tree: Tree, block: str | None) -> None:
        word = token_arg(tree)
        if word.value == v.RECOVERED:
            return  # stands in for a line that already has a syntax error
        message, hint = unknown_keyword(word.value, block)
        self.report(UNKNOWN_FIELD, word, message, hint)

    def _fields(
        self,
        tree: Tree,
        block: str,
        build: dict[str, Callable[[Tree], object]],
    ) -> dict[str, Any]:
        """Build a block's settings; each may be given once (keywords for the block's model,
        which validates them)."""
        values: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for child in args(tree):
            if not isinstance(child, Tree):
                continue
            key = _kind(child)
            if key == "unknown":
                self.unknown(child, block)
                continue
            if key not in build:
                continue  # e.g. the model name, handled by the caller
            if key in first_line and key != "pool":
                self.report(
                    DUPLICATE_DEFINITION, child, f"'{key}' is set twice in this {block} block",
                    f"remove one (the first is on line {first_line[key]})",
                )
                continue
            first_line[key] = first_token(child).line
            value = build[key](child)
            if key == "pool":
                values.setdefault("pools", []).append(value)
            elif value is not None:
                values[key] = value
        return values

    def defaults(self, tree: Tree) -> m.Defaults:
        fields = self._fields(
            tree, "defaults",
            {
                "headroom": lambda t: self.amount(token_arg(t), "headroom"),
                "chunk": lambda t: self.size(token_arg(t), "chunk"),
                "capacity": lambda t: self._not_here(t, "capacity", "defaults", 'gpu * { capacity 141 GiB }'),
            },
        )
        return m.Defaults(span=span_of(tree), **fields)

    def _not_here(self, tree: Tree, key: str, block: str, example: str) -> None:
        self.report(UNKNOWN_FIELD, tree, f"'{key}' cannot be set in a {block} block", f"use `{example}`")

    def gpu(self, tree: Tree) -> m.GpuBlock:
        selector = tree_arg(tree)
        ids = () if _kind(selector) == "all_gpus" else tuple(self.string(t) for t in token_args(selector))
        fields = self._fields(
            tree, "gpu",
            {
                "headroom": lambda t: self.amount(token_arg(t), "headroom"),
                "capacity": lambda t: self.size(token_arg(t), "capacity"),
                "chunk": lambda t: self.size(token_arg(t), "chunk"),
            },
        )
        return m.GpuBlock(span=span_of(tree), ids=ids, **fields)

    def model(self, tree: Tree) -> m.ModelBlock:
        fields = self._fields(
            tree, "model",
            {
                "engine": lambda t: self.name(token_arg(t)),
                "priority": lambda t: self.integer(token_arg(t), "priority"),
                "reserve": lambda t: self.size(token_arg(t), "reserve"),
                "min": lambda t: self.amount(token_arg(t), "min"),
                "max": lambda t: self.amount(token_arg(t), "max"),
                "weight": lambda t: self.integer(token_arg(t), "weight"),
                "pool": self.pool,
            },
        )
        pools = tuple(fields.pop("pools", ()))
        return m.ModelBlock(span=span_of(tree), name=self.string(token_arg(tree)), pools=pools, **fields)

    def pool(self, tree: Tree) -> m.PoolBlock:
        fields = self._fields(
            tree, "pool",
            {
                "owner": lambda t: self.owner(token_arg(t)),
                "max": lambda t: self.amount(token_arg(t), "max"),
            },
        )
        return m.PoolBlock(span=span_of(tree), name=self.name(token_arg(tree)), **fields)

    def owner(self, token: Token) -> m.Name | None:
        if token.value not in v.OWNERS:
            self.report(
                INVALID_VALUE, token, f"unknown owner '{token.value}'",
                did_you_mean(token.value, v.OWNERS) or "expected 'runtime' or 'elastic'",
            )
            return None
        return self.name(token)

    def rule(self, tree: Tree) -> m.Rule:
        fields = self._fields(
            tree, "rule",
            {
                "when": lambda t: self.expression(tree_arg(t)),
                "order": self.order,
                "shrink": lambda t: self.shrink(token_arg(t)),
                "grace": lambda t: self.duration(token_arg(t), "grace"),
                "cooldown": lambda t: self.duration(token_arg(t), "cooldown"),
            },
        )
        if "shrink" in fields:
            fields["shrink_to"] = fields.pop("shrink")
        return m.Rule(span=span_of(tree), name=self.string(token_arg(tree)), **fields)

    def order(self, tree: Tree) -> tuple[m.OrderKey, ...] | None:
        keys: list[m.OrderKey] = []
        keys_given = [k for k in args(tree) if isinstance(k, Tree)]
        for key in keys_given:
            words = token_args(key)
            attribute = words[0]
            ok = True
            if attribute.value == "by" and len(words) > 1 and words[1].value in v.ORDER_KEYS:
                self.report(
                    INVALID_VALUE, attribute, "'order' takes the attribute itself, without 'by'",
                    f"write `order {words[1].value}`",
                )
                continue
            if attribute.value not in v.ORDER_KEYS:
                prefix, _, short = attribute.value.rpartition(".")
                hint: str | None
                if prefix == "model" and short in v.ORDER_KEYS:
                    hint = f"order takes the short name: did you mean '{short}'?"
                elif prefix:
                    hint = "order takes the short names of model attributes, e.g. `order priority asc, idle desc`"
                else:
                    hint = did_you_mean(attribute.value, v.ORDER_KEYS)
                self.report(
                    UNKNOWN_ATTRIBUTE, attribute,
                    f"'{attribute.value}' is not an instance attribute to order by",
                    hint or "expected one of " + ", ".join(v.ORDER_KEYS),
                )
                ok = False
            descending = False
            if len(words) > 1:
                direction = words[1]
                if direction.value not in v.DIRECTIONS:
                    alias = v.DIRECTION_ALIASES.get(direction.value.lower())
                    self.report(
                        INVALID_VALUE, direction, f"unknown order direction '{direction.value}'",
                        f"did you mean '{alias}'?" if alias
                        else did_you_mean(direction.value, v.DIRECTIONS) or "expected 'asc' or 'desc'",
                    )
                    ok = False
                descending = direction.value == "desc"
            if ok:
                keys.append(m.OrderKey(span=span_of(key), attribute=self.name(attribute), descending=descending))
        return tuple(keys) if len(keys) == len(keys_given) else None

    def shrink(self, token: Token) -> m.ShrinkTo | None:
        span = span_of(token)
        if token.type == "NAME":
            if token.value in v.SHRINK_TARGETS:
                return m.ShrinkTo(span=span, kind=token.value)
            self.report(
                INVALID_VALUE, token, f"cannot shrink to '{token.value}'",
                did_you_mean(token.value, v.SHRINK_TARGETS) or "expected min, target, a size or a percentage",
            )
            return None
        amount = self.amount(token, "shrink to")
        return None if amount is None else m.ShrinkTo(span=span, kind="amount", amount=amount)

    # ---- expressions --------------------------------------------------------------

    def expression(self, node: Tree) -> m.Expr | None:
        kind = _kind(node)
        if kind == "comparison":
            return self.comparison(node)
        if kind == "group":
            return self.expression(tree_arg(node))
        operands = [self.expression(c) for c in tree_args(node)]
        if any(o is None for o in operands):
            return None
        span = span_of(node)
        if kind == "not_expr":
            return m.Not(span=span, operand=operands[0])
        if kind == "and_expr":
            return m.And(span=span, operands=tuple(operands))
        return m.Or(span=span, operands=tuple(operands))

    def comparison(self, node: Tree) -> m.Compare | None:
        left_token, op, right_token = token_args(node)
        left = self.operand(left_token)
        right = self.operand(right_token)
        if left is None or right is None:
            return None
        if not self._comparable(left, op, right, left_token, right_token):
            return None
        return m.Compare(span=span_of(node), left=left, op=op.value, right=right)

    def operand(self, token: Token) -> m.Operand | None:
        span = span_of(token)
        if token.type == "ATTRIBUTE":
            kind = v.ATTRIBUTES.get(token.value)
            if kind is None:
                self.report(
                    UNKNOWN_ATTRIBUTE, token, f"unknown attribute '{token.value}'",
                    did_you_mean(token.value, v.ATTRIBUTES)
                    or "expected one of " + ", ".join(v.ATTRIBUTES),
                )
                return None
            return m.Attr(span=span, name=token.value, kind=kind)
        if token.type == "STRING":
            return self.string(token)
        if token.type == "NAME":
            return self.name(token)
        q = self.quantity(token)
        if q is None:
            return None
        if q.unit is None:
            return self._int(q)
        if q.unit == "%":
            return m.PercentLit(span=span, percent=Decimal(q.number_text))
        if q.unit in SIZE_UNITS:
            return self._size(q, q.unit)
        if q.unit in DURATION_UNITS:
            return self._duration(q, q.unit)
        self.report(
            UNKNOWN_UNIT, q.unit_span, f"unknown unit '{q.unit}'",
            unit_hint(q.unit, (*SIZE_UNITS, *DURATION_UNITS))
            or "sizes use B, KiB, MiB, GiB, TiB or %; durations use ms, s, m or h",
        )
        return None

    def _comparable(self, left: m.Operand, op: Token, right: m.Operand, left_token: Token, right_token: Token) -> bool:
        attrs = [o for o in (left, right) if isinstance(o, m.Attr)]
        if not attrs:
            for side, token in ((left, left_token), (right, right_token)):
                full = _attribute_for(side.value) if isinstance(side, m.Name) else None
                if full is not None and isinstance(side, m.Name):
                    self.report(UNKNOWN_ATTRIBUTE, token, f"unknown attribute '{side.value}'", f"did you mean '{full}'?")
                    return False
            self.report(
                INVALID_VALUE, op, "a comparison needs an attribute on at least one side",
                "e.g. `gpu.free < 8 GiB`",
            )
            return False
        for attr, other, token in ((left, right, right_token), (right, left, left_token)):
            if not isinstance(attr, m.Attr):
                continue
            if attr.kind == "string" and op.value not in ("==", "!="):
                self.report(
                    INVALID_VALUE, op, f"{attr.name} can only be compared with == or !=",
                    f"e.g. `{attr.name} == {_example_name(attr)}`",
                )
                return False
            if isinstance(other, m.Attr):
                if other.kind != attr.kind:
                    self.report(
                        INVALID_VALUE, op,
                        f"cannot compare {attr.name} ({_ATTRIBUTE_KIND_WORDS[attr.kind]}) with {other.name} ({_ATTRIBUTE_KIND_WORDS[other.kind]})",
                        _compare_hint(attr),
                    )
                    return False
                continue
            other_kind = _literal_kind(other)
            if other_kind == attr.kind or (other_kind == "zero" and attr.kind in ("size", "duration", "int")):
                continue
            if isinstance(other, m.Name) and other.value in v.ORDER_KEYS:
                self.report(
                    UNKNOWN_ATTRIBUTE, token, f"unknown attribute '{other.value}'",
                    f"did you mean 'model.{other.value}'?",
                )
                return False
            if isinstance(other, m.Name) and f"gpu.{other.value}" in v.ATTRIBUTES:
                self.report(
                    UNKNOWN_ATTRIBUTE, token, f"unknown attribute '{other.value}'",
                    f"did you mean 'gpu.{other.value}'?",
                )
                return False
            hint = _compare_hint(attr)
            if other_kind in ("int", "zero") and attr.kind == "size":
                hint = f"add a unit, e.g. `{token.value} GiB`"
            elif other_kind in ("int", "zero") and attr.kind == "duration":
                hint = f"add a unit, e.g. `{token.value}s`"
            self.report(
                INVALID_DURATION if attr.kind == "duration" else INVALID_VALUE,
                token,
                f"cannot compare {attr.name} ({_ATTRIBUTE_KIND_WORDS[attr.kind]}) with {token.value} ({_VALUE_KIND_WORDS[other_kind]})",
                hint,
            )
            return False
        return True

    # ---- values -----------------------------------------------------------------------

    def quantity(self, token: Token) -> _Quantity | None:
        match = _QUANTITY.fullmatch(token.value)
        assert match is not None, f"the lexer produced a QUANTITY the builder cannot read: {token.value!r}"
        number_text, unit = match.group(1), match.group(2)
        digits = number_text.lstrip("+-").replace(".", "")
        if len(digits.lstrip("0")) > MAX_DIGITS:
            self.report(OUT_OF_RANGE, token, f"the number {number_text[:12]}… is too large", "sizes stay below 8 EiB")
            return None
        # a whole number (most are) is cheaper to make than a Fraction, and behaves the same here
        number = int(number_text) if number_text.lstrip("+-").isdigit() else Fraction(number_text)
        return _Quantity(token, number_text, number, unit, match.start(2) if unit else 0)

    def integer(self, token: Token, setting: str) -> m.IntLit | None:
        q = self.quantity(token)
        if q is None:
            return None
        if q.unit is not None:
            self.report(
                INVALID_VALUE, token, f"{setting} takes a whole number, not '{token.value}'",
                f"write `{setting} {q.number_text}`",
            )
            return None
        return self._int(q, setting)

    def _int(self, q: _Quantity, setting: str | None = None) -> m.IntLit | None:
        if q.number.denominator != 1:
            self.report(
                INVALID_VALUE, q.token, f"{setting or 'this'} takes a whole number, not {q.number_text}",
                f"did you mean `{setting} {round(q.number)}`?" if setting else "write a whole number",
            )
            return None
        return m.IntLit(span=q.span, value=int(q.number))

    def size(self, token: Token, setting: str) -> m.SizeLit | None:
        value = self.amount(token, setting, percent_ok=False)
        assert value is None or isinstance(value, m.SizeLit)
        return value

    def amount(self, token: Token, setting: str, percent_ok: bool = True) -> m.SizeLit | m.PercentLit | None:
        q = self.quantity(token)
        if q is None:
            return None
        if q.unit == "%":
            if percent_ok:
                return m.PercentLit(span=q.span, percent=Decimal(q.number_text))
            self.report(
                INVALID_VALUE, token, f"{setting} takes a size, not a percentage",
                f"e.g. `{setting} 141 GiB`",
            )
            return None
        if q.unit is None:
            if q.number == 0:
                return m.SizeLit(span=q.span, bytes=0, number=q.number_text, unit="B")
            self.report(
                INVALID_VALUE, token, f"{setting} needs a unit: '{q.number_text}' alone is not a size",
                f"did you mean `{setting} {q.number_text} GiB`"
                + (f" or `{setting} {q.number_text}%`" if percent_ok else "") + "?",
            )
            return None
        if q.unit in DURATION_UNITS:
            self.report(
                INVALID_VALUE, token, f"{setting} takes a size, not a duration ('{token.value}')",
                "sizes use B, KiB, MiB, GiB, TiB" + (" or %" if percent_ok else ""),
            )
            return None
        if q.unit not in SIZE_UNITS:
            units = (*SIZE_UNITS, "%") if percent_ok else tuple(SIZE_UNITS)
            self.report(
                UNKNOWN_UNIT, q.unit_span, f"unknown unit '{q.unit}'",
                unit_hint(q.unit, units) or "sizes use " + ", ".join(units),
            )
            return None
        return self._size(q, q.unit)

    def _size(self, q: _Quantity, unit: str) -> m.SizeLit:
        return m.SizeLit(span=q.span, bytes=size_bytes(q.number, unit), number=q.number_text, unit=unit)

    def duration(self, token: Token, setting: str) -> m.DurationLit | None:
        q = self.quantity(token)
        if q is None:
            return None
        if q.unit is None:
            self.report(
                INVALID_DURATION, token, f"{setting} needs a time unit: '{q.number_text}' alone is not a duration",
                f"did you mean `{setting} {q.number_text}s`?",
            )
            return None
        if q.unit not in DURATION_UNITS:
            if q.unit in SIZE_UNITS or q.unit == "%":
                self.report(
                    INVALID_DURATION, token, f"{setting} takes a duration, not '{token.value}'",
                    "durations use ms, s, m or h",
                )
            else:
                self.report(
                    UNKNOWN_UNIT, q.unit_span, f"unknown unit '{q.unit}'",
                    unit_hint(q.unit, DURATION_UNITS) or "durations use ms, s, m or h",
                )
            return None
        return self._duration(q, q.unit)

    def _duration(self, q: _Quantity, unit: str) -> m.DurationLit | None:
        if q.number < 0:
            self.report(INVALID_DURATION, q.token, f"a duration cannot be negative ('{q.token.value}')",
                        f"did you mean `{q.token.value.lstrip('-')}`?")
            return None
        return m.DurationLit(
            span=q.span, seconds=duration_seconds(q.number, unit), number=q.number_text, unit=unit
        )

    def string(self, token: Token) -> m.Str:
        return m.Str(span=span_of(token), value=_unquote(token.value))

    def name(self, token: Token) -> m.Name:
        return m.Name(span=span_of(token), value=token.value)


BLOCK_FIELDS: dict[str | None, tuple[str, ...]] = {
    None: v.TOP_LEVEL,
    "defaults": v.DEFAULTS_FIELDS,
    "gpu": v.GPU_FIELDS,
    "model": v.MODEL_FIELDS,
    "pool": v.POOL_FIELDS,
    "rule": v.RULE_FIELDS,
}
"""The statements each block accepts (None: the top level)."""


def unknown_keyword(word: str, block: str | None) -> tuple[str, str]:
    """Message and hint for a statement ``word`` that ``block`` (None: the top level) does not accept.

    A keyword of another block says where it belongs; anything else gets the
    closest keyword of this block, or the list of them.
    """
    if block is not None and word in v.TOP_LEVEL:
        return f"'{word}' cannot appear inside a {block} block", "is a '}' missing before this line?"
    where = f"in a {block} block" if block else "at the top level"
    homes = [name for name, fields in BLOCK_FIELDS.items() if name is not None and word in fields]
    if homes:
        return f"'{word}' cannot appear {where}", f"'{word}' belongs in a {' or '.join(homes)} block"
    allowed = BLOCK_FIELDS.get(block, ())
    hint = did_you_mean(word, allowed) or "expected " + ", ".join(f"'{a}'" for a in allowed)
    return f"unknown keyword '{word}' {where}", hint


_SHORT_ATTRIBUTES = {name.split(".", 1)[1]: name for name in v.ATTRIBUTES}
"""``free`` → ``gpu.free``: each attribute by its name without the scope."""


def _attribute_for(word: str) -> str | None:
    """The attribute a bare word in a comparison probably means (``free`` → ``gpu.free``)."""
    short = word if word in _SHORT_ATTRIBUTES else closest(word, _SHORT_ATTRIBUTES)
    return _SHORT_ATTRIBUTES[short] if short is not None else None


_ESCAPE = re.compile(r"\\(.)")


def _unquote(text: str) -> str:
    body = text[1:-1]
    return _ESCAPE.sub(r"\1", body) if "\\" in body else body  # most names have no escape


def _literal_kind(node: m.Operand) -> str:
    if isinstance(node, (m.SizeLit, m.PercentLit)):
        return "size"
    if isinstance(node, m.DurationLit):
        return "duration"
    if isinstance(node, m.IntLit):
        return "zero" if node.value == 0 else "int"
    return "string"


_KIND_WORDS = {"size": "a size", "duration": "a duration", "string": "a name"}
_VALUE_KIND_WORDS = {**_KIND_WORDS, "zero": "a number", "int": "a number without a unit"}
"""What a literal value is, for messages."""
_ATTRIBUTE_KIND_WORDS = {**_KIND_WORDS, "int": "a whole number"}
"""What an attribute holds, for messages."""


def _compare_hint(attr: m.Attr) -> str:
    """What ``attr`` can be compared with, as an example."""
    return {
        "size": f"compare {attr.name} with a size or a percentage, e.g. `{attr.name} < 8 GiB`",
        "duration": f"compare {attr.name} with a duration, e.g. `{attr.name} > 60s`",
        "int": f"compare {attr.name} with a whole number, e.g. `{attr.name} >= 10`",
        "string": f"compare {attr.name} with a name, e.g. `{attr.name} == {_example_name(attr)}`",
    }[attr.kind]


def _example_name(attr: m.Attr) -> str:
    return "vllm" if attr.name == "model.engine" else '"qwen3-8b"'


def unit_hint(unit: str, units: Collection[str]) -> str | None:
    """``did you mean 's'?`` for ``sec``, ``GiB`` for ``GiBB``: a known spelling, else the closest unit;
    for ``e9`` (``1e9``) or ``e3MiB``, that numbers have no exponent."""
    if re.fullmatch(r"[eE]\d+\w*", unit):  # 1e9, 1e3MiB: the lexer reads the exponent as a unit
        return v.EXPONENT_HINT
    alias = v.UNIT_ALIASES.get(unit.lower())
    if alias is not None and alias in units:
        return f"did you mean '{alias}'?"
    return did_you_mean(unit, units)


__all__ = ["PolicyBuilder", "span_of", "closest"]
