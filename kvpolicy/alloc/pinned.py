"""The limit an elastic pool with pinned chunks maps under: the ledger's, plus the pinned chunks.

Both engines keep a page that kernels may read or write at any time: vLLM's block 0
(its *null block*: block tables point at it for tokens that hold no KV) and SGLang's
page 0 (padded tokens write there). The chunks that hold it are mapped at start and
never given back. They are admitted once as **runtime-owned** memory (a static
admission, reported as a runtime-owned pool), not as elastic memory: an instance
whose guarantee is 0 still starts, and the controller's limits and targets stay
about the memory that really grows and shrinks. ``PinnedFirst`` presents both to the
allocator (a ``BlockPool`` or a ``ChunkMapping``) as one ``LimitSource``: the first
``allowance`` bytes it admits come from the static admission, the rest from the
ledger; every figure it reports to the ledger leaves the pinned bytes out. An
optional ``cap`` bounds the elastic limit it passes on (the policy's ``max`` for a
pool whose reservation is larger than what the policy lets it map).
"""

from __future__ import annotations

from collections.abc import Callable

from kvpolicy.alloc.limits import AckStatus, LimitReading, LimitSource


class PinnedFirst:
    """``LimitSource`` = ``inner`` (elastic, the ledger's) + ``allowance`` bytes admitted statically.

    Invariant: ``inner`` sees exactly the bytes held beyond the allowance. Not
    thread-safe on its own: the block pool calls it under its lock.
    """

    def __init__(self, inner: LimitSource, allowance: int, pinned_used: int = 0, cap: int | None = None) -> None:
        if allowance < 0 or pinned_used < 0:
            raise ValueError(f"allowance {allowance} and pinned_used {pinned_used} must be >= 0")
        if cap is not None and cap < 0:
            raise ValueError(f"cap {cap} must be >= 0")
        self.inner = inner
        self.cap = cap
        """The most elastic bytes the limit passed on allows, whatever the ledger says (None: no cap)."""
        self.allowance = allowance
        self.pinned_used = pinned_used
        """Bytes of live blocks that are not the engine's KV (the null block): left out of ``used``."""
        self._left = allowance  # not yet admitted
        self._allow_pending = 0
        self._allow_held = 0
        self._inner_pending = 0
        self._inner_held = 0
        self._seen: tuple[LimitReading, LimitReading] | None = None
        self.used_bytes: Callable[[], int] | None = None
        """Where the bytes in use come from, if not from the block pool (the engine's own count)."""

    @property
    def elastic_held(self) -> int:
        """Bytes the ledger counts as this instance's mapped elastic memory."""
        return self._inner_held

    @property
    def pinned_held(self) -> int:
        return self._allow_held

    def read(self) -> LimitReading:
        reading = self.inner.read()
        seen = self._seen
        if seen is not None and seen[0] is reading:  # the ledger's hot path returns the same object
            return seen[1]
        a, cap = self.allowance, self.cap
        limit, target = (reading.limit, reading.target) if cap is None else (min(reading.limit, cap), min(reading.target, cap))
        shifted = LimitReading(limit + a, target + a, reading.revision, reading.guarantee + a)
        self._seen = (reading, shifted)
        return shifted

    def certain_refusal(self, nbytes: int) -> bool:
        rest = nbytes - min(nbytes, self._left)
        return rest > 0 and self.inner.certain_refusal(rest)

    def admit(self, nbytes: int) -> bool:
        take = min(nbytes, self._left)
        rest = nbytes - take
        if rest and not self.inner.admit(rest):
            return False
        self._left -= take
        self._allow_pending += take
        self._inner_pending += rest
        return True

    def commit(self, nbytes: int) -> None:
        a = min(nbytes, self._allow_pending)
        self._allow_pending -= a
        self._allow_held += a
        rest = nbytes - a
        if rest:
            assert rest <= self._inner_pending, "commit beyond what was admitted"
            self._inner_pending -= rest
            self._inner_held += rest
            self.inner.commit(rest)

    def rollback(self, nbytes: int) -> None:
        i = min(nbytes, self._inner_pending)
        if i:
            self._inner_pending -= i
            self.inner.rollback(i)
        rest = nbytes - i
        assert rest <= self._allow_pending, "rollback beyond what was admitted"
        self._allow_pending -= rest
        self._left += rest

    def release(self, nbytes: int) -> None:
        # Elastic bytes go first: the pinned chunks are released only when the pool closes.
        i = min(nbytes, self._inner_held)
        if i:
            self._inner_held -= i
            self.inner.release(i)
        rest = nbytes - i
        assert rest <= self._allow_held, "released more than was held"
        self._allow_held -= rest
        self._left += rest

    def report(self, used: int, mapped: int, waiting: int = 0) -> None:
        used = self.used_bytes() if self.used_bytes is not None else max(0, used - self.pinned_used)
        self.inner.report(used, max(0, mapped - self._allow_held), waiting)

    def acknowledge(self, revision: int, status: AckStatus) -> None:
        self.inner.acknowledge(revision, status)

    def pressure(self) -> int:
        return self.inner.pressure()
