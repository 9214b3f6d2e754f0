"""What the engine core and its ranks say to each other about an elastic KV cache (tensor parallel > 1).

One ``RankRequest`` goes to every rank in one blocking collective call; each rank answers
one ``RankAnswer``. Both are pydantic models: they cross a process boundary (vLLM's
``collective_rpc``, pickled), so each side validates what it receives.

Ops: ``describe`` (the rank's buffer geometry and limits, once at the scheduler's start),
``map`` (admit and map ``chunks`` in the rank's own ledger instance and zero them),
``unmap`` (synchronise the device, unmap ``chunks``, release them in the ledger),
``sync`` (the limits in force; carries the core's report, acknowledgement and activity).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

Op = Literal["describe", "map", "unmap", "sync"]
Outcome = Literal["ok", "limit", "admission", "device", "capacity", "error", "absent"]
"""``ok``, a refusal (the reasons of ``kvpolicy.alloc.OutOfBlocks``), a driver ``error``, or
``absent``: the rank has no elastic buffer."""


class RankRequest(BaseModel):
    """The core's request, the same for every rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Op
    chunks: tuple[NonNegativeInt, ...] = ()
    """Chunk indices to map or unmap (each in every layer region of the rank's buffer)."""
    used: NonNegativeInt | None = None
    """Bytes in blocks the scheduler has handed out, for the rank's report (None: nothing new)."""
    waiting: NonNegativeInt = 0
    """With ``used``: the growth the core's books refused in its last period (work waiting for memory)."""
    ack: Literal["applied", "deferred"] | None = None
    """The core's answer to the limits last read: each rank acknowledges its own revision so."""
    active: bool = False
    """The scheduler had requests since the last call (the rank touches its activity)."""


class RankLimits(BaseModel):
    """One rank's limits in force (its ledger instance's, without its pinned chunks)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limit: NonNegativeInt
    target: NonNegativeInt
    guarantee: NonNegativeInt
    revision: NonNegativeInt
    pressure: NonNegativeInt


class RankGeometry(BaseModel):
    """How a rank's buffer lies: the core's books must have the same shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_blocks: int = Field(gt=0)
    bytes_per_block: int = Field(gt=0)
    chunk: int = Field(gt=0)
    pinned: NonNegativeInt
    grow_chunks: int = Field(gt=0)
    regions: int = Field(gt=0)
    block_stride: int = Field(gt=0)


class RankAnswer(BaseModel):
    """One rank's answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: NonNegativeInt
    gpu: str
    outcome: Outcome
    detail: str = ""
    """Why, for a refusal or an error (the rank's own message)."""
    mapped: tuple[NonNegativeInt, ...] = ()
    """The chunk indices mapped on the rank after the call, ascending."""
    limits: RankLimits | None = None
    geometry: RankGeometry | None = None
