"""Errors of the ledger: each says what is wrong, with the figures, and what to do."""

from __future__ import annotations


class LedgerError(RuntimeError):
    """Something about the ledger prevents the operation; the message says what and how to fix it."""


class UnsafeSegment(LedgerError):
    """A segment or the ledger directory fails the ownership or permission checks."""


class ForeignSegment(UnsafeSegment):
    """The segment belongs to another user, and this process is not configured to trust it."""


class CorruptSegment(LedgerError):
    """The segment is not a kvpolicy ledger, or its contents fail their checks: never trusted."""


class LayoutVersionMismatch(CorruptSegment):
    """The segment was written with another layout version; it is refused, never misread."""


class SlotsFull(LedgerError):
    """Every slot of the GPU's segment belongs to a live instance."""


class DuplicateInstance(LedgerError):
    """A live instance with the same id is already attached."""


class Detached(LedgerError):
    """The instance was detached (or belongs to the parent of this forked process)."""


class AdmissionRefused(LedgerError):
    """A static admission does not fit the GPU's unreserved memory; the message has every figure."""

    def __init__(self, message: str, figures: dict[str, int]) -> None:
        super().__init__(message)
        self.figures = figures
