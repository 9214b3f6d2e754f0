"""The adapter's ports: the policy's reserve (through the real loader) and static admission."""

from __future__ import annotations

import threading

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.adapters.sglang_dsv4.ports import (
    InstanceIdentity,
    policy_reserve,
    require_policy_file,
)
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.errors import AdmissionRefused
from kvpolicy.units import GiB, MiB
from tests.support.ledgers import SharedLedger

POLICY = 'version 1\n\nmodel "deepseek-v4-flash" {\n  engine sglang\n  reserve 40 GiB\n}\n'


def env_for(tmp_path, text=POLICY):
    path = tmp_path / "p.kvp"
    path.write_text(text)
    return AdapterEnv(enabled=True, policy=path, model=None, ledger_dir=tmp_path)


def test_reserve_and_its_line_come_from_the_policy(tmp_path):
    read = policy_reserve(env_for(tmp_path))
    reserve = read("deepseek-v4-flash")
    assert reserve.bytes == 40 * GiB and reserve.line == 3 and reserve.where.endswith("p.kvp:3")
    assert read("qwen3-8b").bytes is None  # no block binds it: no reserve


def test_a_broken_policy_is_an_error_with_its_position(tmp_path):
    read = policy_reserve(env_for(tmp_path, 'version 1\nmodel "x" { reserve 4 GiBB }\n'))
    with pytest.raises(AdapterError, match=r"p\.kvp:2:\d+.*unknown unit 'GiBB'"):
        read("x")


def test_policy_must_be_named_and_exist(tmp_path):
    with pytest.raises(AdapterError, match="KVPOLICY_POLICY is not set"):
        require_policy_file(AdapterEnv(enabled=True, policy=None, model=None, ledger_dir=tmp_path))
    with pytest.raises(AdapterError, match="no such file"):
        require_policy_file(AdapterEnv(enabled=True, policy=tmp_path / "missing.kvp", model=None, ledger_dir=tmp_path))


def test_two_engines_starting_together_cannot_both_take_the_last_bytes(tmp_path):
    ledger = SharedLedger(tmp_path / "ledger", {"cuda:0": 60 * GiB})
    results: list[object] = []
    barrier = threading.Barrier(8)

    def start(i: int) -> None:
        session = ledger.connect(InstanceIdentity(model=f"m{i}", gpu="cuda:0", rank=0))
        barrier.wait()
        try:
            results.append(session.admit_static(40 * GiB))
        except AdmissionRefused as exc:
            results.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for r in results if r == 40 * GiB) == 1
    refused = [r for r in results if isinstance(r, AdmissionRefused)]
    assert len(refused) == 7 and "20 GiB" in str(refused[0])
    assert ledger.held("cuda:0") == 40 * GiB


def test_a_report_replaces_the_admission(tmp_path):
    ledger = SharedLedger(tmp_path / "ledger", {"cuda:0": 10 * GiB})
    session = ledger.connect(InstanceIdentity(model="m", gpu="cuda:0", rank=0))
    session.admit_static(8 * GiB)
    session.report_pools({"swa": PoolFacts(bytes=3 * GiB), "c4": PoolFacts(bytes=4 * GiB)})
    assert ledger.admitted("cuda:0") == {} and ledger.held("cuda:0") == 7 * GiB
    other = ledger.connect(InstanceIdentity(model="n", gpu="cuda:0", rank=0))
    assert other.admit_static(3 * GiB) == 3 * GiB
    with pytest.raises(AdmissionRefused):
        ledger.connect(InstanceIdentity(model="o", gpu="cuda:0", rank=0)).admit_static(1 * MiB)
