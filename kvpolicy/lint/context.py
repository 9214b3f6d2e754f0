"""What a check-phase rule sees: the policy, and what is known of the GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from kvpolicy.facts import Facts
from kvpolicy.lint.budget import WorkBudget
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.policy.model import Node, Policy

N = TypeVar("N", bound=Node)


@dataclass(frozen=True)
class LintContext:
    policy: Policy
    gpu_capacity: int | None = None
    """``--gpu-capacity``: every GPU has this capacity (and hosts one instance per model)."""
    facts: Facts | None = None
    """``--facts``: the GPUs and instances to check the policy against."""
    parse_diagnostics: tuple[Diagnostic, ...] = ()
    """What parsing and building already reported (so rules don't report it again)."""
    budget: WorkBudget | None = None
    """The work budget of a hot reload's validation (None: unbounded, as for ``kvpolicy lint``)."""

    def charge(self, units: int) -> None:
        """Count work against the budget (raises BudgetExceeded once it is spent)."""
        if self.budget is not None:
            self.budget.charge(units)

    @property
    def file(self) -> str:
        return self.policy.file

    def reported_within(self, node: Node) -> bool:
        """Whether parsing already reported something inside ``node`` (a part that
        failed to build is missing from the model: don't report it missing again)."""
        span = node.span
        start, end = (span.line, span.col), (span.end_line, span.end_col)
        return any(start <= (d.line, d.col) < end for d in self.parse_diagnostics)

    @cached_property
    def nodes(self) -> tuple[Node, ...]:
        """Every node of the policy in source order (walked once, shared by the rules)."""
        return tuple(self.policy.walk())

    @cached_property
    def _by_type(self) -> dict[type[Node], list[Any]]:
        """Nodes by their exact type (so a list holds nodes of its key's type only)."""
        index: dict[type[Node], list[Any]] = {}
        for node in self.nodes:
            index.setdefault(type(node), []).append(node)
        return index

    def nodes_of(self, *types: type[N]) -> list[N]:
        """The nodes of exactly these types, in source order (a policy of 10,000
        lines has some 20,000 nodes; most rules look at a few kinds)."""
        if len(types) == 1:
            return self._by_type.get(types[0], [])
        wanted = set(types)
        found: list[Any] = [n for n in self.nodes if type(n) in wanted]  # the walk's order: no sort
        return found
