"""The adapters' collective for group admission: real torch.distributed gloo worlds of rank processes.

Each rank is a spawned process that joins a gloo world, as vLLM's and SGLang's workers do
for their CPU group (spawned, as theirs are: a forked one would inherit whatever default process
group an earlier test left in the pytest process, and gloo refuses to make a second), and admits its reserve on its own GPU's real ledger through
``process_group_ranks``: all ranks or none, and a rank killed mid-way makes gloo's
collective fail on the others, which give their admissions back.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kvpolicy.adapters.collective import process_group_ranks
from kvpolicy.runtime.ledger import GpuLedger
from kvpolicy.runtime.session import (
    EngineIdentity,
    EngineSession,
    GroupAdmissionFailed,
    GroupRefused,
    MeasuredGpu,
)
from kvpolicy.units import MiB
from tests.support.network import free_loopback_port

dist = pytest.importorskip("torch.distributed")

SPAWN = mp.get_context("spawn")
HANG = 120.0
"""Only to catch a hang (the process group's timeout too), never a speed goal."""


@dataclass
class World:
    """What ``process_group_ranks`` reads of an engine's ``GroupCoordinator``."""

    rank_in_group: int
    world_size: int
    cpu_group: Any = None  # None: the default (gloo) group


def _rank(rank: int, size: int, port: int, ledger_dir: Path, capacity: int, die: bool, out: Any) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=timedelta(seconds=HANG))
        session = EngineSession.open(
            EngineIdentity(f"e/{rank}", "m", "vllm", "e", rank, f"cuda:{rank}"),
            measure=lambda gpu: MeasuredGpu(capacity, 0, 0), ledger_dir=ledger_dir, handle_signals=False,
        )
        group = process_group_ranks(World(rank, size))
        assert group is not None
        gather = group.gather
        if die:  # admitted on its GPU, then gone before the ranks agree
            calls = [0]

            def dying(value: Any) -> Any:
                calls[0] += 1
                if calls[0] == rank + 2:  # the gather right after its own turn
                    os.kill(os.getpid(), signal.SIGKILL)
                return gather(value)

            group = type(group)(group.rank, group.size, dying)
        try:
            session.admit_static_group(30 * MiB, group)
            outcome: tuple[Any, ...] = ("admitted",)
        except GroupRefused as e:
            outcome = ("refused", e.rank, e.gpu)
        except GroupAdmissionFailed as e:
            outcome = ("failed", str(e))
        out.put((rank, (*outcome, session.snapshot().runtime_reserved)))
        session.close()
    except BaseException:  # noqa: BLE001 - a rank reports any failure to the test
        out.put((rank, traceback.format_exc()))


def run_world(ledger_dir: Path, size: int, capacity: dict[int, int], die: int = -1) -> dict[int, Any]:
    port, out = free_loopback_port(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_rank, args=(r, size, port, ledger_dir, capacity.get(r, 100 * MiB), r == die, out))
             for r in range(size)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(size - (die >= 0)):
        rank, res = out.get(timeout=HANG)
        assert not isinstance(res, str), f"rank {rank}:\n{res}"
        results[rank] = res
    for p in procs:
        p.join(HANG)
        assert p.exitcode is not None
    return results


def test_a_gloo_world_admits_every_rank_or_none(ledger_dir: Path) -> None:
    assert process_group_ranks(World(0, 1)) is None  # one rank: plain admission
    assert run_world(ledger_dir, 2, {}) == {0: ("admitted", 30 * MiB), 1: ("admitted", 30 * MiB)}
    refused = run_world(ledger_dir.parent / "refused", 2, {1: 20 * MiB})
    assert refused == {0: ("refused", 1, "cuda:1", 0), 1: ("refused", 1, "cuda:1", 0)}


def test_gloo_reports_a_dead_rank_and_the_survivor_gives_its_admission_back(ledger_dir: Path) -> None:
    results = run_world(ledger_dir, 2, {}, die=1)
    [(kind, message, held)] = [results[0]]
    assert (kind, held) == ("failed", 0), results
    assert "could not agree" in message
    led = GpuLedger.open(ledger_dir, "cuda:1", create=False)
    try:
        assert [v.id for v in led.reclaim_dead()] == ["e/1"]
        assert led.totals().runtime_reserved == 0
    finally:
        led.close()
