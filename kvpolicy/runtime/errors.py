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

    tag = "damaged"
    """The suffix a segment moved aside for this reason gets (``<gpu>.ledger.damaged-<ns>``)."""


class TornSlot(CorruptSegment):
    """A slot's records belong to different occupants: damage (no crash of a kvpolicy writer leaves this)."""


class SegmentTruncated(CorruptSegment):
    """The segment file is shorter than its header says: nothing beyond its end is touched."""

    tag = "truncated"


class SegmentSetAside(CorruptSegment):
    """A segment that failed its checks and that nobody held a slot in was renamed aside (once)."""


class LayoutVersionMismatch(CorruptSegment):
    """The segment was written with another layout version; it is refused, never misread.

    The message says which side to upgrade: a newer segment means this process is the old
    one; an older one means the engines (or controller) that made it are, and once none
    of them holds a slot in it, it is moved aside and replaced.
    """

    def __init__(self, message: str, found: int, expected: int) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected

    @property
    def newer(self) -> bool:
        return self.found > self.expected

    @property
    def tag(self) -> str:  # type: ignore[override]  # the base's class constant, per instance here
        return f"layout{self.found}"

    @classmethod
    def between(cls, path: object, found: int) -> LayoutVersionMismatch:
        from kvpolicy import __version__
        from kvpolicy.runtime.layout import LAYOUT_VERSION as ours

        if found > ours:
            msg = (
                f"kvpolicy ledger: {path} has layout version {found}, newer than this kvpolicy {__version__} "
                f"(layout version {ours}): upgrade this process's kvpolicy (engine plugin or controller) to the "
                "version the other side runs. Refusing to misread it. See docs/deploy.md, \"Upgrades\"."
            )
        else:
            msg = (
                f"kvpolicy ledger: {path} has layout version {found}, older than this kvpolicy {__version__} "
                f"(layout version {ours}): upgrade the engines still attached to this GPU (and the controller) "
                "to this version. Once none of them holds a slot in it, the old segment is moved aside and "
                "replaced automatically. See docs/deploy.md, \"Upgrades\"."
            )
        return cls(msg, found, ours)


class ControllerRunning(LedgerError):
    """Another controller holds the ledger directory's controller lock."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder
        """Its pid, as it wrote it in the lock file ("unknown" if unreadable)."""


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
