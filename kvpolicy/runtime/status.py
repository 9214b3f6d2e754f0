"""The controller's status file beside the ledger (``<ledger-dir>/status.json``), and the live view.

The controller writes what only it knows — the active policy, the last reload and its
error, its own pid and heartbeat — with ``write_status`` (atomically: a temporary
file renamed over the old one, so a reader sees the old or the new file, never half).
``kvpolicy status`` reads it with ``read_status`` and refreshes the GPUs and instances
from the live ledger with ``live_status``, so the figures are current even when the
controller is stale. The JSON shape is ``kvpolicy status``'s in docs/json.md (schema 1);
fields beyond it are additions, allowed by the contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvpolicy.evaluate.decision import RuleReport
from kvpolicy.facts import ElasticFacts
from kvpolicy.json_text import JsonInvalid, parse_json
from kvpolicy.runtime.admission import elastic_budget
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.segment import Access
from kvpolicy.runtime.stores import MAX_DOCUMENT_BYTES, read_document, write_document
from kvpolicy.validation import describe

if TYPE_CHECKING:
    from kvpolicy.runtime.directory import LedgerView

STATUS_FILE = "status.json"
STATUS_SCHEMA: Final = 1
STALE_AFTER = 10.0
"""A controller whose heartbeat is older than this (seconds) is stale: in status, and for /healthz."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class PolicyStatus(_Model):
    file: str
    sha256: str
    revision: int
    loaded_at: float


class ReloadError(_Model):
    file: str
    line: int
    """0 (with ``col`` and ``code`` empty) for a file that could not be read at all."""
    col: int
    code: str
    message: str
    hint: str | None = None


class LastReload(_Model):
    ok: bool
    at: float
    sha256: str | None = None
    error: ReloadError | None = None


class Reserved(_Model):
    total: int
    by_pool: dict[str, int] = Field(default_factory=dict)


class GpuStatus(_Model):
    id: str
    name: str | None = None
    """The display name (cuda:N in the controller's NVML numbering); ``id`` is the ledger's key, the UUID."""
    elastic_budget: int
    free: int
    reserved: Reserved
    capacity: int | None = None
    headroom: int | None = None
    other_used: int | None = None
    figures: Literal["none", "provisional", "published"] = "none"


class PoolStatus(_Model):
    owner: Literal["runtime", "elastic"]
    bytes: int


class InstanceStatus(_Model):
    id: str
    model: str
    engine: str
    gpu: str
    pid: int
    pools: dict[str, PoolStatus]
    elastic: ElasticFacts | None
    limit: int
    target: int
    revision: int
    acked_revision: int
    ack: Literal["applied", "deferred"] | None
    guarantee: int = 0
    stuck: bool = False
    deferred_since: float | None = None
    idle_seconds: float = 0.0
    engine_id: str | None = None
    """Instances sharing an engine id are one tensor-parallel engine (null: its own id)."""
    rank: int = 0


class ControllerStatus(_Model):
    pid: int
    started_at: float
    heartbeat_at: float
    tick_seconds: float
    observe: bool = False
    stale: bool = False
    stopped_at: float | None = None
    """When the controller stopped cleanly (SIGTERM, SIGINT); null while it runs or after a crash."""
    running: bool | None = None
    """Whether a controller holds the directory's lock as ``kvpolicy status`` reads it: false for one
    that died without a clean stop, at once rather than once its heartbeat is stale (null: not known)."""


class Status(_Model):
    """``kvpolicy status --format json``: schema 1."""

    schema_: Literal[1] = Field(default=STATUS_SCHEMA, alias="schema")
    written_at: float = 0.0
    policy: PolicyStatus | None = None
    last_reload: LastReload | None = None
    controller: ControllerStatus | None = None
    gpus: list[GpuStatus] = Field(default_factory=list)
    instances: list[InstanceStatus] = Field(default_factory=list)
    rules: list[RuleReport] = Field(default_factory=list)
    """Every complete rule of the policy in force and where it stands on each instance
    (``explain``'s ``rules``), as of the controller's last evaluation."""
    problems: list[str] = Field(default_factory=list)
    refused_segments: dict[str, str] = Field(default_factory=dict)
    """GPUs whose ledger segment is there but cannot be used (damaged, another layout, another
    owner), and why: engines on them get no new limits until it can."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def status_path(ledger_dir: Path | str) -> Path:
    return Path(ledger_dir) / STATUS_FILE


def write_status(ledger_dir: Path | str, status: Status, access: Access | None = None) -> Path:
    """Replace ``<ledger_dir>/status.json`` atomically (mode 0600, or 0660 for the ledger's group)."""
    return write_document(status_path(ledger_dir), status.to_json() + "\n", access)


MAX_STATUS_BYTES = MAX_DOCUMENT_BYTES
"""The largest status file read (a full node's status is well under 1 MiB); a larger one is refused."""


def read_status(ledger_dir: Path | str) -> Status | None:
    """The controller's last status, or None if it never wrote one; LedgerError if it is not valid.

    Refused before it is read: a symlink, anything but a regular file (``/dev/zero``), a file
    others may read or write, and one over ``MAX_STATUS_BYTES``.
    """
    path = status_path(ledger_dir)
    text = read_document(path, "a status file")
    if text is None:
        return None
    try:
        return Status.model_validate(parse_json(text))
    except JsonInvalid as exc:
        problem = exc.problem if exc.line is None else f"not valid JSON at {exc.line}:{exc.col}: {exc.problem}"
    except ValidationError as exc:
        problem = describe(exc, Status)
    except RecursionError:  # validating what parsed but nests too deep for the models
        problem = "nested too deeply"
    raise LedgerError(f"kvpolicy ledger: {path} is not a valid status file (schema {STATUS_SCHEMA}): {problem}")


def live_status(view: LedgerView, base: Status | None = None, *, stuck_after: float = 60.0, stale_after: float = STALE_AFTER) -> Status:
    """``base`` (the controller's file, if any) with GPUs and instances refreshed from ``view`` (a LedgerView)."""
    gpus: list[GpuStatus] = []
    instances: list[InstanceStatus] = []
    names = {g.id: g.name for g in base.gpus} if base is not None else {}  # only the controller's NVML knows them
    for gpu, state in sorted(view.gpus.items()):
        budget = elastic_budget(state.figures, state.totals)
        used = sum(v.used for v in state.instances if v.elastic)
        by_pool = state.reserved_by_pool
        gpus.append(
            GpuStatus(
                id=gpu,
                name=names.get(gpu),
                elastic_budget=budget,
                free=budget - used,
                reserved=Reserved(total=sum(by_pool.values()), by_pool=by_pool),
                capacity=state.figures.capacity if state.figures.known else None,
                headroom=state.figures.headroom if state.figures.known else None,
                other_used=state.figures.other_used if state.figures.known else None,
                figures=state.figures.source,
            )
        )
        for v in state.instances:
            facts = v.facts(view.now)
            instances.append(
                InstanceStatus(
                    id=v.id,
                    model=v.model,
                    engine=v.engine,
                    gpu=gpu,
                    pid=v.pid,
                    pools={n: PoolStatus(owner=p.owner, bytes=p.bytes) for n, p in facts.pools.items()},
                    elastic=facts.elastic,
                    limit=v.limit,
                    target=v.target,
                    revision=v.revision,
                    acked_revision=v.ack_revision,
                    ack=v.ack,
                    guarantee=v.guarantee,
                    stuck=v.stuck(view.now, stuck_after),
                    deferred_since=v.deferred_since,
                    idle_seconds=facts.idle_seconds,
                    engine_id=facts.engine_id,
                    rank=facts.rank,
                )
            )
    status = base.model_copy(deep=True) if base is not None else Status()
    status.gpus, status.instances = gpus, instances
    status.problems = list(view.problems) + [p for s in view.gpus.values() for p in s.problems]
    status.refused_segments = dict(view.refused)
    if status.controller is not None:
        hb = view.heartbeat if view.heartbeat is not None else status.controller.heartbeat_at
        status.controller.heartbeat_at = hb
        # a clean stop is not a wedged loop: it is reported as stopped, not stale
        status.controller.stale = status.controller.stopped_at is None and view.now - hb > stale_after
    return status
