"""A work budget for validating a policy: lint stops, and refuses the policy, once it is spent.

The controller validates every save of the policy file before it goes live; a text
that is slow to check must not stall the reloads after it. Work is counted in
units, not seconds, so a policy is accepted or refused the same way on a fast
machine and on a loaded one: a unit is about one character parsed, one node a
check visits, or one step of the glob comparison (``kvpolicy.policy.globs``).
"""

from __future__ import annotations

from dataclasses import dataclass

RELOAD_WORK_BUDGET = 20_000_000
"""What the controller allows one reload's validation: a 1 MiB policy (the size cap) that
parses takes well under a quarter of it; the rest is for the glob comparisons."""


class BudgetExceeded(Exception):
    def __init__(self, budget: WorkBudget) -> None:
        super().__init__(f"validation work {budget.spent:,} over the budget of {budget.limit:,} units")
        self.budget = budget


@dataclass
class WorkBudget:
    limit: int
    spent: int = 0

    def charge(self, units: int) -> None:
        """Count ``units`` of work; raises BudgetExceeded once more than ``limit`` is spent."""
        self.spent += units
        if self.spent > self.limit:
            raise BudgetExceeded(self)
