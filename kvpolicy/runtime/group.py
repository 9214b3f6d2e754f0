"""All-or-nothing static admission across the ranks of one tensor-parallel engine.

Each rank is its own process with its own ``EngineSession`` on its own GPU's ledger;
ledgers are per GPU, so no single lock covers an engine. ``GroupAdmission`` makes the
ranks' static admissions one decision (docs/ledger.md, "Tensor-parallel engines"):

1. every rank learns every rank's GPU (one ``gather``);
2. the ranks take their turns in one global order — by GPU id, then rank — and at its
   turn a rank admits its reserve on its own GPU (an ordinary static admission: counted
   in that GPU's R at once, so no other engine can over-admit against it); after each
   turn one ``gather`` tells every rank how the turn went;
3. the first refusal stops the turns: every rank that admitted gives its admission back
   (``withdraw_static``, which only lowers R and so cannot be refused), and every rank
   raises the same ``GroupRefused`` naming the rank, the GPU and the ledger's figures;
4. when every turn succeeded, the engine is admitted: nothing more is stored.

Why turns in a global order: an admission never waits for memory, it admits or refuses
at once, so two engines can never deadlock; the order is what keeps them from refusing
each other. Two engines on the same GPUs meet first on the lowest one; the one refused
there holds nothing on the others, so the other one gets through.

Crash safety comes from the ledger: a rank that dies at any instruction drops its slot
lock, and its slot — with whatever it admitted — is freed at the next reclaim (the
controller's tick, or the next attach on that GPU). The survivors see ``gather`` fail
(the engine's collective reports a dead peer or times out), give their admissions back
and raise ``GroupAdmissionFailed``.

``gather`` is the engine's collective, so this module stays engine-independent: an
all-gather of one small picklable value over the engine's ranks, returning the values
in rank order (vLLM and SGLang workers: ``torch.distributed.all_gather_object`` on the
engine's CPU group). It must raise, not hang forever, when a rank dies: the process
group's timeout bounds the wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpolicy.runtime.errors import AdmissionRefused, LedgerError

Gather = Callable[[Any], Sequence[Any]]
"""All-gather of one small picklable value over the engine's ranks, in rank order; raises when a rank is gone."""


@dataclass(frozen=True)
class RankGroup:
    """This process's place among the engine's ranks, and the engine's collective over them."""

    rank: int
    """0 ≤ rank < size, this process's index in ``gather``'s result."""
    size: int
    gather: Gather


class RankSession(Protocol):
    """What group admission needs of one rank's ``EngineSession``."""

    @property
    def gpu(self) -> str: ...

    def admit_static(self, nbytes: int) -> int: ...

    def withdraw_static(self) -> None: ...


class GroupRefused(AdmissionRefused):
    """One rank's GPU refused its reserve, so no rank of the engine is admitted (raised on every rank)."""

    def __init__(self, message: str, figures: dict[str, int], rank: int, gpu: str) -> None:
        super().__init__(message, figures)
        self.rank = rank
        self.gpu = gpu


class GroupAdmissionFailed(LedgerError):
    """The ranks could not agree (a rank died or its collective failed); this rank holds no admission."""


@dataclass(frozen=True)
class _Turn:
    """How one rank's turn went, as gathered to every rank."""

    ok: bool
    message: str = ""
    figures: dict[str, int] | None = None
    refused: bool = False
    """A refusal by the ledger (``AdmissionRefused``), as opposed to another error."""


class GroupAdmission:
    """One rank's side of an engine's all-or-nothing static admission; every rank calls ``admit``."""

    def __init__(self, session: RankSession, *, rank: int, size: int, gather: Gather, engine: str = "") -> None:
        if size < 1 or not 0 <= rank < size:
            raise LedgerError(f"kvpolicy ledger: rank {rank} of a tensor-parallel group of {size}: expected 0 ≤ rank < size")
        self.session = session
        self.rank = rank
        self.size = size
        self.engine = engine
        self._gather = gather
        self.admitted = False

    def order(self, gpus: Sequence[str]) -> list[int]:
        """The ranks in the global order of turns: by GPU id, then by rank."""
        return sorted(range(self.size), key=lambda r: (gpus[r], r))

    def admit(self, nbytes: int) -> int:
        """Admit ``nbytes`` on this rank's GPU if and only if every rank's reserve is admitted on its own.

        Returns ``nbytes``; raises ``GroupRefused`` (every rank alike) when a rank's GPU refused, and
        ``GroupAdmissionFailed`` when the ranks could not agree. Either way this rank then holds no
        static admission.
        """
        held = False
        try:
            gpus = [str(g) for g in self._exchange(self.session.gpu, "its GPU")]
            for turn, r in enumerate(self.order(gpus)):
                mine: _Turn | None = None
                if r == self.rank:
                    mine, held = self._take_turn(nbytes)
                outcome = self._exchange(mine, f"turn {turn + 1} of {self.size}")[r]
                if not isinstance(outcome, _Turn):
                    raise GroupAdmissionFailed(f"kvpolicy ledger: {self._who()}: rank {r} sent no outcome for its turn")
                if not outcome.ok:
                    raise self._refused(r, gpus[r], outcome)
        except BaseException:
            if held:
                self.session.withdraw_static()
            raise
        self.admitted = True
        return nbytes

    def _take_turn(self, nbytes: int) -> tuple[_Turn, bool]:
        try:
            self.session.admit_static(nbytes)
        except AdmissionRefused as e:
            return _Turn(False, str(e), dict(e.figures), refused=True), False
        except Exception as e:  # noqa: BLE001 - the others must hear of any failure, or they would wait for this rank
            return _Turn(False, f"{type(e).__name__}: {e}"), False
        return _Turn(True), True

    def _exchange(self, value: Any, what: str) -> Sequence[Any]:
        try:
            values = self._gather(value)
        except Exception as e:
            raise GroupAdmissionFailed(
                f"kvpolicy ledger: {self._who()}: the ranks could not agree on the static admission ({what}): "
                f"{type(e).__name__}: {e}. A rank may have died; no rank keeps an admission (a dead rank's is "
                "freed by the next reclaim)."
            ) from e
        if len(values) != self.size:
            raise GroupAdmissionFailed(
                f"kvpolicy ledger: {self._who()}: the collective returned {len(values)} values for {self.size} ranks"
            )
        return values

    def _refused(self, rank: int, gpu: str, outcome: _Turn) -> LedgerError:
        head = (
            f"kvpolicy ledger: {self._who()}: rank {rank} on {gpu} was not admitted, so no rank of the engine is "
            f"({self.size} ranks, all or none; the ranks admitted before it gave their admissions back)"
        )
        if outcome.refused:
            return GroupRefused(f"{head}: {outcome.message}", dict(outcome.figures or {}), rank, gpu)
        return GroupAdmissionFailed(f"{head}: {outcome.message}")

    def _who(self) -> str:
        name = f"engine {self.engine!r}" if self.engine else "tensor-parallel engine"
        return f"{name} rank {self.rank}/{self.size}"


__all__ = ["Gather", "GroupAdmission", "GroupAdmissionFailed", "GroupRefused", "RankGroup", "RankSession"]
