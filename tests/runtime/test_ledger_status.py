"""The status file beside the ledger, and the live status built from the ledger."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.client import attach
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.errors import LedgerError
from kvpolicy.runtime.ledger import GpuLimits, InstanceLimits
from kvpolicy.runtime.segment import Access
from kvpolicy.runtime.status import (
    ControllerStatus,
    LastReload,
    PolicyStatus,
    ReloadError,
    Status,
    live_status,
    read_status,
    status_path,
    write_status,
)
from kvpolicy.units import GiB


def sample_status(revision: int = 3) -> Status:
    return Status(
        written_at=100.0,
        policy=PolicyStatus(file="p.kvp", sha256="ab" * 32, revision=revision, loaded_at=90.0),
        last_reload=LastReload(ok=False, at=95.0, sha256="cd" * 32,
                               error=ReloadError(file="p.kvp", line=3, col=7, code="KV001", message="unknown unit 'GiBB'")),
        controller=ControllerStatus(pid=4242, started_at=80.0, heartbeat_at=100.0, tick_seconds=1.0),
    )


def test_write_then_read_round_trips_with_the_documented_mode(ledger_dir: Path) -> None:
    ledger_dir.mkdir(mode=0o700)
    path = write_status(ledger_dir, sample_status())
    assert path == status_path(ledger_dir)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_status(ledger_dir) == sample_status()
    assert json.loads(path.read_text())["schema"] == 1
    assert sorted(p.name for p in ledger_dir.iterdir()) == ["status.json"]  # no temporary file left


def test_group_status_is_0660(ledger_dir: Path) -> None:
    ledger_dir.mkdir(mode=0o700)
    gid = os.getegid()
    path = write_status(ledger_dir, sample_status(), Access(group=gid))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660 and os.stat(path).st_gid == gid


def test_missing_status_is_none_and_a_damaged_one_is_an_error(ledger_dir: Path) -> None:
    ledger_dir.mkdir(mode=0o700)
    assert read_status(ledger_dir) is None
    status_path(ledger_dir).write_text('{"schema": 1, "gpus": [{"id": 3}]}')
    status_path(ledger_dir).chmod(0o600)  # as the controller writes it: only the content is wrong
    with pytest.raises(LedgerError, match="is not a valid status file") as exc:
        read_status(ledger_dir)
    assert "\n" not in str(exc.value) and "errors.pydantic.dev" not in str(exc.value)  # one line, the field named
    assert "gpus.0" in str(exc.value)
    for damaged, said in (("[" * 100_000 + "]" * 100_000, "nested too deeply"), ('{"schema": ' + "9" * 5000 + "}", "digits"),
                          ('{"schema": 1,', "not valid JSON at 1:14")):
        status_path(ledger_dir).write_text(damaged)
        with pytest.raises(LedgerError, match=said):
            read_status(ledger_dir)


def test_readers_never_see_a_partial_file(ledger_dir: Path) -> None:
    ledger_dir.mkdir(mode=0o700)
    write_status(ledger_dir, sample_status(0))
    stop, read_once = threading.Event(), threading.Event()
    seen: list[int] = []
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                s = read_status(ledger_dir)
                assert s is not None and s.policy is not None
                seen.append(s.policy.revision)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
            read_once.set()

    t = threading.Thread(target=reader)
    t.start()
    for rev in range(1, 200):
        if rev == 100:  # however the threads are scheduled, the reader reads while the writes go on
            assert read_once.wait(120)
        write_status(ledger_dir, sample_status(rev))
    stop.set()
    t.join()
    assert not errors, errors[0]
    assert seen == sorted(seen) and len(seen) > 0


def test_live_status_has_the_contract_fields(ledger_dir: Path) -> None:
    dsv4 = attach(model="deepseek-v4-flash", engine="sglang", id="dsv4/0", gpu="cuda:0", ledger_dir=ledger_dir,
                  handle_signals=False)
    qwen = attach(model="qwen3-8b", engine="vllm", id="qwen/0", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True,
                  handle_signals=False)
    try:
        with LedgerDir(ledger_dir) as ld:
            ld.publish(ld.read(), 3, {"cuda:0": GpuLimits(100 * GiB, 4 * GiB, 6 * GiB, 80 * GiB)},
                       {"qwen/0": InstanceLimits(limit=50 * GiB, target=30 * GiB, guarantee=2 * GiB)})
            dsv4.admit_static(10 * GiB)
            dsv4.report_pools({"swa": PoolFacts(bytes=3 * GiB), "c4": PoolFacts(bytes=2 * GiB)})
            assert qwen.admit(GiB)
            qwen.commit(GiB)
            qwen.report(GiB // 4, GiB, 5 * GiB // 2)  # a 2.5 GiB growth refused: work waits for it
            qwen.acknowledge(3, "applied")
            ld.heartbeat(now=100.0)
            status = live_status(ld.read(now=105.0), sample_status(), stale_after=10)
        doc = json.loads(status.to_json())
        assert set(doc) >= {"schema", "policy", "last_reload", "gpus", "instances"}
        assert set(doc["policy"]) >= {"file", "sha256", "revision", "loaded_at"}
        assert set(doc["last_reload"]["error"]) >= {"file", "line", "col", "code", "message"}
        (gpu,) = doc["gpus"]
        assert set(gpu) >= {"id", "elastic_budget", "free", "reserved"}
        assert gpu["reserved"] == {"total": 5 * GiB, "by_pool": {"c4": 2 * GiB, "swa": 3 * GiB}}
        assert gpu["elastic_budget"] == 80 * GiB and gpu["free"] == 80 * GiB - GiB // 4
        by_id = {i["id"]: i for i in doc["instances"]}
        q = by_id["qwen/0"]
        assert set(q) >= {"id", "model", "engine", "gpu", "pid", "pools", "elastic", "limit", "target", "revision",
                          "acked_revision", "ack"}
        assert (q["limit"], q["target"], q["revision"], q["acked_revision"], q["ack"]) == (50 * GiB, 30 * GiB, 3, 3, "applied")
        assert q["elastic"] == {"used": GiB // 4, "mapped": GiB, "waiting": 5 * GiB // 2}
        assert by_id["dsv4/0"]["elastic"] is None
        assert by_id["dsv4/0"]["pools"]["swa"] == {"owner": "runtime", "bytes": 3 * GiB}
        assert doc["controller"]["heartbeat_at"] == 100.0 and doc["controller"]["stale"] is False
        assert Status.model_validate(doc) == status
    finally:
        dsv4.detach()
        qwen.detach()


def test_live_status_marks_a_silent_controller_stale(ledger_dir: Path) -> None:
    inst = attach(model="m", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)
    try:
        with LedgerDir(ledger_dir) as ld:
            ld.heartbeat(now=100.0)
            status = live_status(ld.read(now=200.0), sample_status(), stale_after=10)
        assert status.controller is not None and status.controller.stale
    finally:
        inst.detach()
