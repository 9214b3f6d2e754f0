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

import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvpolicy.facts import ElasticFacts
from kvpolicy.runtime.admission import elastic_budget
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.segment import Access, check_owner

STATUS_FILE = "status.json"
STATUS_SCHEMA = 1
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
    col: int
    code: str
    message: str


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


class ControllerStatus(_Model):
    pid: int
    started_at: float
    heartbeat_at: float
    tick_seconds: float
    observe: bool = False
    stale: bool = False


class Status(_Model):
    """``kvpolicy status --format json``: schema 1."""

    schema_: Literal[1] = Field(default=STATUS_SCHEMA, alias="schema")
    written_at: float = 0.0
    policy: PolicyStatus | None = None
    last_reload: LastReload | None = None
    controller: ControllerStatus | None = None
    gpus: list[GpuStatus] = Field(default_factory=list)
    instances: list[InstanceStatus] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def status_path(ledger_dir: Path | str) -> Path:
    return Path(ledger_dir) / STATUS_FILE


def write_status(ledger_dir: Path | str, status: Status, access: Access | None = None) -> Path:
    """Replace ``<ledger_dir>/status.json`` atomically (mode 0600, or 0660 for the ledger's group)."""
    access = access or Access()
    path = status_path(ledger_dir)
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _status_error(exc, path) from None
    try:
        if access.group is not None:
            os.fchown(fd, -1, access.group)
        os.fchmod(fd, access.file_mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1
            f.write(status.to_json())
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _status_error(exc, path) from None
        raise
    return path


def _status_error(exc: OSError, path: Path) -> LedgerError:
    """A failed status write as a LedgerError; ENOSPC named, with what to do."""
    what = errno.errorcode.get(exc.errno or 0, "error")
    hint = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = " Free space on that filesystem (for /dev/shm: a larger --shm-size or tmpfs size=)."
    return LedgerError(f"kvpolicy ledger: cannot write {path} ({what}: {exc.strerror or exc}).{hint}")


MAX_STATUS_BYTES = 16 * 1024 * 1024
"""The largest status file read (a full node's status is well under 1 MiB); a larger one is refused."""


def read_status(ledger_dir: Path | str) -> Status | None:
    """The controller's last status, or None if it never wrote one; LedgerError if it is not valid.

    Refused before it is read: a symlink, anything but a regular file (``/dev/zero``), a file
    others may read or write, and one over ``MAX_STATUS_BYTES``.
    """
    path = status_path(ledger_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LedgerError(f"kvpolicy ledger: {path} is a symlink; refusing to follow it") from None
        raise LedgerError(f"kvpolicy ledger: cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise LedgerError(f"kvpolicy ledger: {path} is not a regular file; refusing to read it")
        check_owner(st, f"the status file {path}", Access(allow_foreign_owner=True))
        if st.st_size > MAX_STATUS_BYTES:
            raise LedgerError(
                f"kvpolicy ledger: {path} is {st.st_size} bytes, more than a status file can be "
                f"({MAX_STATUS_BYTES} B); refusing to read it"
            )
        raw = f.read(MAX_STATUS_BYTES + 1)
    if len(raw) > MAX_STATUS_BYTES:
        raise LedgerError(f"kvpolicy ledger: {path} grew past {MAX_STATUS_BYTES} B while read; refusing it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LedgerError(f"kvpolicy ledger: {path} is not UTF-8 ({exc}); not a status file") from None
    try:
        return Status.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise LedgerError(f"kvpolicy ledger: {path} is not a valid status file (schema {STATUS_SCHEMA}): {exc}") from None


def live_status(view, base: Status | None = None, *, stuck_after: float = 60.0, stale_after: float = STALE_AFTER) -> Status:
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
                    ack=v.ack,  # type: ignore[arg-type]
                    guarantee=v.guarantee,
                    stuck=v.stuck(view.now, stuck_after),
                    deferred_since=v.deferred_since,
                    idle_seconds=facts.idle_seconds,
                )
            )
    status = base.model_copy(deep=True) if base is not None else Status()
    status.gpus, status.instances = gpus, instances
    status.problems = list(view.problems) + [p for s in view.gpus.values() for p in s.problems]
    if status.controller is not None:
        hb = view.heartbeat if view.heartbeat is not None else status.controller.heartbeat_at
        status.controller.heartbeat_at = hb
        status.controller.stale = view.now - hb > stale_after
    return status
