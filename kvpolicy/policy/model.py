"""The typed, immutable policy: what a ``.kvp`` file says, with the span of every node.

Sizes are bytes, durations seconds; percentages stay percentages until they are
resolved against a GPU's capacity (``Amount.resolve``). Settings that a file does
not give are ``None`` here; ``kvpolicy.policy.resolve`` applies the defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from functools import cache
from typing import Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict

from kvpolicy.diagnostics import Span
from kvpolicy.units import percent_of

N = TypeVar("N", bound="Node")


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    span: Span

    def children(self) -> Iterator[Node]:
        """Direct child nodes, in field order."""
        values = self.__dict__
        for name in _node_fields(type(self)):
            value = values[name]
            if isinstance(value, Node):
                yield value
            elif isinstance(value, tuple):
                yield from (v for v in value if isinstance(v, Node))

    def walk(self) -> Iterator[Node]:
        """This node and every node below it, depth first, in source order."""
        found: list[Node] = []
        _collect(self, found)
        return iter(found)

    def moved(self: N, lines: int) -> N:
        """This node with every span in it ``lines`` lines further down: what building the
        same text lines further down makes (a statement below an added line). Copied
        without validation: the values are the validated ones, only the lines change."""
        values = self.__dict__
        update: dict[str, object] = {"span": self.span.moved(lines)}
        for name in _node_fields(type(self)):
            value = values[name]
            if isinstance(value, Node):
                update[name] = value.moved(lines)
            elif isinstance(value, tuple) and value:  # a field left at its default stays unset
                update[name] = tuple(v.moved(lines) if isinstance(v, Node) else v for v in value)
        return self.model_copy(update=update)


def _collect(node: Node, found: list[Node]) -> None:
    """Append ``node`` and every node below it to ``found``, depth first (a list, not nested
    generators: a lint walks some 20,000 nodes of a 10,000-line policy)."""
    found.append(node)
    values = node.__dict__
    for name in _node_fields(type(node)):
        value = values[name]
        if isinstance(value, Node):
            _collect(value, found)
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, Node):
                    _collect(item, found)


@cache
def _node_fields(cls: type[Node]) -> tuple[str, ...]:
    """The fields of ``cls`` that can hold nodes (a walk skips numbers and strings)."""
    return tuple(name for name, f in cls.model_fields.items() if _may_hold_nodes(f.annotation))


def _may_hold_nodes(annotation: object) -> bool:
    if isinstance(annotation, type):
        return issubclass(annotation, Node)
    return any(_may_hold_nodes(arg) for arg in get_args(annotation))


# ---- literals ---------------------------------------------------------------


class SizeLit(Node):
    """``40 GiB``: ``bytes`` exact (floor for fractional bytes), ``unit`` as written."""

    bytes: int
    number: str
    unit: str

    def resolve(self, capacity: int) -> int:
        return self.bytes

    @property
    def text(self) -> str:
        return f"{self.number} {self.unit}"


class PercentLit(Node):
    """``40%`` of a GPU's capacity."""

    percent: Decimal

    def resolve(self, capacity: int) -> int:
        return percent_of(Fraction(self.percent), capacity)

    @property
    def text(self) -> str:
        return f"{self.percent}%"


Amount = SizeLit | PercentLit


class DurationLit(Node):
    seconds: float
    number: str
    unit: str

    @property
    def text(self) -> str:
        return f"{self.number}{self.unit}"


class IntLit(Node):
    value: int


class Name(Node):
    """A bare word: an engine, a pool, an owner, an attribute's short name."""

    value: str


class Str(Node):
    """A quoted string, unescaped."""

    value: str


# ---- settings blocks ----------------------------------------------------------


class Defaults(Node):
    headroom: Amount | None = None
    chunk: SizeLit | None = None


class GpuBlock(Node):
    """``gpu * { ... }`` (``ids`` empty) or ``gpu "cuda:0", "cuda:1" { ... }``."""

    ids: tuple[Str, ...] = ()
    headroom: Amount | None = None
    capacity: SizeLit | None = None
    chunk: SizeLit | None = None

    @property
    def is_wildcard(self) -> bool:
        return not self.ids


class PoolBlock(Node):
    name: Name
    owner: Name | None = None
    max: Amount | None = None


class ModelBlock(Node):
    """``model "pattern" { ... }``: the pattern is an exact name or a glob (``*``, ``?``)."""

    name: Str
    engine: Name | None = None
    priority: IntLit | None = None
    reserve: SizeLit | None = None
    min: Amount | None = None
    max: Amount | None = None
    weight: IntLit | None = None
    pools: tuple[PoolBlock, ...] = ()


# ---- rules and expressions -----------------------------------------------------

CompareOp = Literal["<", "<=", ">", ">=", "==", "!="]
AttrKind = Literal["size", "duration", "int", "string"]


class Attr(Node):
    """``gpu.free``, ``model.idle``: ``name`` is the full dotted name."""

    name: str
    kind: AttrKind


Operand = Attr | SizeLit | PercentLit | DurationLit | IntLit | Str | Name


class Compare(Node):
    left: Operand
    op: CompareOp
    right: Operand


class Not(Node):
    operand: Expr


class And(Node):
    operands: tuple[Expr, ...]


class Or(Node):
    operands: tuple[Expr, ...]


Expr = Compare | Not | And | Or


class OrderKey(Node):
    """One key of ``order``: an instance attribute's short name and its direction."""

    attribute: Name
    descending: bool = False


class ShrinkTo(Node):
    """``shrink to min | target | SIZE | PERCENT``."""

    kind: Literal["min", "target", "amount"]
    amount: Amount | None = None


class Rule(Node):
    name: Str
    when: Expr | None = None
    order: tuple[OrderKey, ...] = ()
    shrink_to: ShrinkTo | None = None
    grace: DurationLit | None = None
    cooldown: DurationLit | None = None


Statement = Defaults | GpuBlock | ModelBlock | Rule


class Policy(Node):
    """A whole policy file. ``statements`` keeps blocks in file order."""

    file: str
    sha256: str
    version: IntLit | None = None
    has_version_statement: bool = False
    """A ``version`` statement is there, even when its number could not be built."""
    statements: tuple[Statement, ...] = ()

    @property
    def defaults(self) -> tuple[Defaults, ...]:
        return tuple(s for s in self.statements if isinstance(s, Defaults))

    @property
    def gpus(self) -> tuple[GpuBlock, ...]:
        return tuple(s for s in self.statements if isinstance(s, GpuBlock))

    @property
    def models(self) -> tuple[ModelBlock, ...]:
        return tuple(s for s in self.statements if isinstance(s, ModelBlock))

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(s for s in self.statements if isinstance(s, Rule))


for _model in (Not, And, Or, Compare, Rule):
    _model.model_rebuild()
