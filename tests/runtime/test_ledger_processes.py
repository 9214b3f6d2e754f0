"""Real processes on a real segment: concurrent admission, kill -9 at random points, signals, forks."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from kvpolicy.runtime import layout as L
from kvpolicy.runtime.client import attach
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.errors import Detached
from kvpolicy.runtime.ledger import GpuLedger, GpuLimits, InstanceLimits, Totals
from kvpolicy.units import GiB, MiB
from tests.runtime.ledger_helpers import audit_locked, slot_sums
from tests.support.processes import read_line
from tests.support.waiting import wait_for

CHUNK = 2 * MiB
FORK = mp.get_context("fork")


# --- 16 processes × 10,000 operations against a small budget ------------------------------------

WORKERS = 16
OPS = 10_000
BUDGET = 48 * CHUNK  # far less than 16 × the per-instance limit: the GPU budget is contended
AUDITED_SAMPLES = 200  # the workers hold their memory until the auditor has read this many totals
HANG = 300.0  # only catches a hang: nothing below waits for the machine to be fast


def _worker(ledger_dir: Path, n: int, ops: int, start: mp.Event, audited: mp.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        rng = random.Random(n)
        inst = attach(model="stress", id=f"w{n}", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True,
                      guarantee=12 * CHUNK, handle_signals=False)
        start.wait()
        mapped = pending = done = admitted = refused = 0
        while done < ops:
            if pending:
                if rng.random() < 0.8:
                    inst.commit(pending)
                    mapped += pending
                else:
                    inst.rollback(pending)
                pending = 0
            elif mapped and rng.random() < 0.45:
                k = rng.randint(1, mapped // CHUNK) * CHUNK
                inst.release(k)
                mapped -= k
            else:
                k = rng.randint(1, 4) * CHUNK
                if inst.admit(k):
                    pending, admitted = k, admitted + 1
                else:
                    refused += 1
            done += 1
            if done % 500 == 0:
                v = inst.snapshot()  # lock-free: nobody else writes this slot's usage
                assert (v.mapped, v.pending) == (mapped, pending), (v.mapped, v.pending, mapped, pending)
        if n == 0 and not mapped and not pending:  # something stays admitted (or the budget is full) for the auditor
            done += 1
            if inst.admit(CHUNK):
                inst.commit(CHUNK)
                mapped, admitted, done = CHUNK, admitted + 1, done + 1
        # Hold what is admitted until the auditor has seen enough, however slowly it was scheduled.
        assert audited.wait(HANG), "the auditor never saw enough"
        if pending:
            inst.rollback(pending)
            done += 1
        if mapped:
            inst.release(mapped)
            done += 1
        inst.detach()
        out.put(("ok", n, done, admitted, refused))
    except BaseException:  # noqa: BLE001 - a worker reports any failure to the test
        out.put(("error", n, traceback.format_exc()))


def _auditor(ledger_dir: Path, ready: mp.Event, audited: mp.Event, stop: mp.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
        ready.set()
        samples = locked = 0
        worst = 0
        while not stop.is_set():
            t = led.totals()  # lock-free, consistent record
            worst = max(worst, t.elastic_committed)
            assert t.elastic_committed <= BUDGET, f"admitted {t.elastic_committed} > budget {BUDGET}"
            samples += 1
            if samples % 25 == 0:
                totals = audit_locked(led)  # header totals == Σ slots, under the lock
                assert totals.elastic_committed <= BUDGET
                locked += 1
            if samples >= AUDITED_SAMPLES and worst:
                audited.set()
        out.put(("ok", samples, locked, worst))
    except BaseException:  # noqa: BLE001 - a worker reports any failure to the test
        out.put(("error", traceback.format_exc()))


def test_sixteen_processes_never_admit_beyond_the_budget_and_lose_no_update(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    led = ld.gpu("cuda:0", create=True)
    ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(capacity=BUDGET + GiB, headroom=GiB, other_used=0, elastic_budget=BUDGET)}, {})
    g0 = led.generation()
    start, ready, audited, stop, out = FORK.Event(), FORK.Event(), FORK.Event(), FORK.Event(), FORK.Queue()
    workers = [FORK.Process(target=_worker, args=(ledger_dir, n, OPS, start, audited, out)) for n in range(WORKERS)]
    auditor = FORK.Process(target=_auditor, args=(ledger_dir, ready, audited, stop, out))
    for p in workers:
        p.start()
    assert wait_for(lambda: led.totals().active == WORKERS, HANG), "workers did not attach"
    auditor.start()
    assert ready.wait(HANG), "the auditor did not start"
    t0 = time.monotonic()
    start.set()
    # the controller keeps publishing new per-instance limits while the workers admit
    revision, rng = 2, random.Random(0)
    while any(p.is_alive() for p in workers) and time.monotonic() < t0 + HANG:
        view = ld.read()
        limits = {v.id: InstanceLimits(limit=rng.randint(4, 24) * CHUNK, target=4 * CHUNK, guarantee=0) for v in view.instances()}
        ld.publish(view, revision, {}, limits)
        revision += 1
        time.sleep(0.02)
    for p in workers:
        p.join(timeout=HANG)
    stop.set()
    auditor.join(timeout=HANG)
    assert not any(p.is_alive() for p in [*workers, auditor]), "a process hung"
    results = [out.get(timeout=HANG) for _ in range(WORKERS + 1)]
    elapsed = time.monotonic() - t0
    errors = [r for r in results if r[0] == "error"]
    assert not errors, "\n".join(str(e[-1]) for e in errors)
    work = [r for r in results if len(r) == 5]
    audit = [r for r in results if len(r) == 4]
    assert len(work) == WORKERS and len(audit) == 1
    ops = sum(r[2] for r in work)
    assert sum(r[3] for r in work) > 0 and sum(r[4] for r in work) > 0, "both admissions and refusals must occur"
    # no lost update: every locked change moved the generation exactly once (attach + ops + detach)
    assert led.generation() - g0 == ops + 2 * WORKERS
    assert led.totals() == Totals(0, 0, 0, 0, 0) == slot_sums(led)
    _, samples, locked, worst = audit[0]
    assert samples >= AUDITED_SAMPLES and locked >= AUDITED_SAMPLES // 25 and 0 < worst <= BUDGET
    print(f"\n{WORKERS} workers × {OPS} ops in {elapsed:.1f}s; auditor: {samples} samples, {locked} locked, peak {worst} B")
    ld.close()


# --- kill -9 at random points -----------------------------------------------------------------------


def _victim(ledger_dir: Path, n: int, ready) -> None:  # type: ignore[no-untyped-def]
    inst = attach(model="victim", id=f"victim-{n}", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True,
                  guarantee=8 * CHUNK, handle_signals=False)
    inst.admit_static(GiB)
    os.write(ready, b"x")
    rng = random.Random(n)
    mapped = 0
    while True:
        k = rng.randint(1, 3) * CHUNK
        if inst.admit(k):
            inst.commit(k)
            mapped += k
        elif mapped:
            inst.release(mapped)
            mapped = 0
        inst.report(mapped // 2, mapped)
        inst.acknowledge(rng.randint(1, 9), "applied")


def _survivor(ledger_dir: Path, n: int, stop, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inst = attach(model="survivor", id=f"survivor-{n}", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True,
                      guarantee=8 * CHUNK, handle_signals=False)
        inst.admit_static(GiB)
        while not stop.is_set():
            if inst.admit(CHUNK):
                inst.commit(CHUNK)
                inst.release(CHUNK)
        v = inst.snapshot()
        inst.detach()
        out.put(("ok", n, v.static_admitted))
    except BaseException:  # noqa: BLE001 - a worker reports any failure to the test
        out.put(("error", n, traceback.format_exc()))


def test_kill_9_at_random_points_is_reclaimed_within_one_tick(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    led = ld.gpu("cuda:0", create=True)
    ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(capacity=200 * GiB, headroom=0, other_used=0, elastic_budget=64 * CHUNK)}, {})
    stop, out = FORK.Event(), FORK.Queue()
    survivors = [FORK.Process(target=_survivor, args=(ledger_dir, n, stop, out)) for n in range(2)]
    for p in survivors:
        p.start()
    assert wait_for(lambda: led.totals().active == 2, HANG), "the survivors did not attach"
    rng = random.Random(1234)
    repaired = 0
    for run in range(100):
        r, w = os.pipe()
        victim = FORK.Process(target=_victim, args=(ledger_dir, run, w))
        victim.start()
        os.close(w)
        assert os.read(r, 1) == b"x", f"run {run}: the victim did not get ready"
        os.close(r)
        time.sleep(rng.random() * 0.004)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        repaired += bool(led.seg.words[L.OFF_DIRTY // 8])  # died inside a change
        gone = ld.reclaim_dead()  # one controller tick
        assert [v.id for v in gone] == [f"victim-{run}"], f"run {run}: reclaimed {[v.id for v in gone]}"
        view = ld.read()
        assert sorted(v.id for v in view.instances()) == ["survivor-0", "survivor-1"], f"run {run}"
        assert view.gpus["cuda:0"].dead == ()
        totals = audit_locked(led)
        assert totals.runtime_reserved == 2 * GiB and totals.active == 2, f"run {run}: {totals}"
    stop.set()
    results = [out.get(timeout=HANG) for _ in survivors]
    for p in survivors:
        p.join(timeout=HANG)
    assert all(r[0] == "ok" and r[2] == GiB for r in results), results
    assert led.totals() == Totals(0, 0, 0, 0, 0)
    print(f"\n100 kill -9 runs; {repaired} died inside a change and had the totals repaired")
    ld.close()


def _die_inside_a_change(ledger_dir: Path) -> None:
    inst = attach(model="m", id="dier", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True, guarantee=GiB,
                  handle_signals=False)
    assert inst.admit(4 * CHUNK)
    led = inst._ledger
    led.change().__enter__()  # holds the write lock, dirty set
    use = led.records.slots[inst.slot].usage
    _, u = use.read(led.seg.mm, led.seg.words)
    use.write(led.seg.mm, led.seg.words, u._replace(pending=u.pending + 8 * CHUNK))  # slot moved, totals not
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_writer_killed_inside_the_lock_neither_deadlocks_nor_skews_the_totals(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    led = ld.gpu("cuda:0", create=True)
    ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(capacity=GiB, headroom=0, other_used=0, elastic_budget=GiB)}, {})
    p = FORK.Process(target=_die_inside_a_change, args=(ledger_dir,))
    p.start()
    p.join(timeout=HANG)
    assert p.exitcode == -signal.SIGKILL
    assert led.seg.words[L.OFF_DIRTY // 8] == p.pid  # it died with the change half done
    assert led.totals().elastic_pending == 4 * CHUNK  # the header missed the last 8 chunks
    survivor = attach(model="m", id="next", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)  # takes the lock
    assert led.seg.words[L.OFF_DIRTY // 8] == 0
    assert led.totals().active == 1 and led.totals().elastic_pending == 0  # rebuilt, and the dead one reclaimed
    survivor.detach()
    ld.close()


def test_next_attach_reclaims_a_dead_instance(ledger_dir: Path) -> None:
    with LedgerDir(ledger_dir, create=True) as ld:
        ld.gpu("cuda:0", create=True)
        ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(capacity=8 * GiB, headroom=0, other_used=0, elastic_budget=GiB)}, {})
    r, w = os.pipe()
    victim = FORK.Process(target=_victim, args=(ledger_dir, 0, w))
    victim.start()
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
    assert led.totals().runtime_reserved == GiB  # still counted: nobody reclaimed yet
    inst = attach(model="m", id="newcomer", gpu="cuda:0", ledger_dir=ledger_dir, handle_signals=False)
    views, _ = led.slots()
    assert [v.id for v in views] == ["newcomer"] and led.totals().runtime_reserved == 0
    inst.detach()
    led.close()


# --- exits and signals --------------------------------------------------------------------------------

ENGINE = """
import signal, sys, time, kvpolicy
# What the launcher left (a failure shows it), then Python's own SIGINT handling whatever that was:
# an ignored disposition and a blocked mask are inherited (a shell's background job ignores SIGINT).
print("inherited SIGINT:", signal.getsignal(signal.SIGINT), "blocked:", signal.pthread_sigmask(signal.SIG_BLOCK, []),
      file=sys.stderr, flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
inst = kvpolicy.attach(model="m", gpu="cuda:0", ledger_dir=sys.argv[1], capacity=1 << 40, guarantee=1 << 30)
inst.admit_static(1 << 30)
print("ready", flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
if sys.argv[2] == "busy":  # mostly inside ledger changes when the signal lands: the detach is deferred
    src = inst.limit_source()
    turns = 0
    while True:
        if src.admit(1 << 21):
            src.commit(1 << 21)
            src.release(1 << 21)
        turns += 1
        if turns == 1000:
            print("busy", flush=True)  # in the loop: the test signals now
time.sleep(60)
"""


@pytest.mark.parametrize(
    "how, code",
    [("exit", 0), ("SIGTERM", -signal.SIGTERM), ("SIGINT", None)] + [("busy", -signal.SIGTERM)] * 3,
)
def test_engine_detaches_on_exit_and_signals(ledger_dir: Path, child_env: dict[str, str], how: str, code: int | None) -> None:
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, str(ledger_dir), how], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert read_line(proc).strip() == "ready", proc.stderr.read()
    led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
    if how != "exit":
        assert led.totals().active == 1
        if how == "busy":
            assert read_line(proc).strip() == "busy", proc.stderr.read()
        proc.send_signal(signal.SIGTERM if how == "busy" else getattr(signal, how))
    try:
        proc.wait(timeout=HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the engine was still running {HANG:.0f} s after {how}; its stderr: {proc.communicate()[1]}")
    if code is not None:
        assert proc.returncode == code, proc.stderr.read()
    else:  # SIGINT: KeyboardInterrupt unwinds, the exit detaches, Python dies of SIGINT
        assert proc.returncode in (-signal.SIGINT, 1, 130), proc.stderr.read()
    # the slot was freed by the engine itself, not reclaimed: no dead slot is left for anyone
    assert led.slots() == ([], []) and led.totals() == Totals(0, 0, 0, 0, 0)
    led.close()


def _forked_child(inst, out) -> None:  # type: ignore[no-untyped-def]
    try:
        reading = inst.read()  # reading the mapping is fine in a fork
        try:
            inst.admit(CHUNK)
            out.put("admitted in the fork")
        except Detached as exc:
            out.put(f"refused: {exc} | {reading.limit}")
        inst.detach()  # a no-op for the parent's slot
    except BaseException:  # noqa: BLE001 - a worker reports any failure to the test
        out.put(traceback.format_exc())


def test_a_fork_cannot_write_through_its_parents_instance(ledger_dir: Path) -> None:
    inst = attach(model="m", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True, guarantee=GiB, capacity=2 * GiB,
                  handle_signals=False)
    out = FORK.Queue()
    p = FORK.Process(target=_forked_child, args=(inst, out))
    p.start()
    p.join(timeout=HANG)
    msg = out.get(timeout=HANG)
    assert msg.startswith("refused:") and "is a fork of it" in msg and msg.endswith(f"| {GiB}"), msg
    with LedgerDir(ledger_dir) as ld:  # the parent's slot lives on, and its lock is still held
        view = ld.read()
        assert [v.id for v in view.instances()] == ["m/0"] and view.gpus["cuda:0"].dead == ()
        assert ld.reclaim_dead() == []
    assert inst.admit(CHUNK)
    inst.detach()


def test_threads_share_one_instance_safely(ledger_dir: Path) -> None:
    inst = attach(model="m", gpu="cuda:0", ledger_dir=ledger_dir, elastic=True, guarantee=GiB, capacity=2 * GiB,
                  handle_signals=False)
    errors: list[str] = []

    def run() -> None:
        try:
            for _ in range(300):
                if inst.admit(CHUNK):
                    inst.commit(CHUNK)
                    inst.release(CHUNK)
        except BaseException:  # noqa: BLE001 - collected and asserted by the test
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    v = inst.snapshot()
    assert (v.mapped, v.pending) == (0, 0)
    assert audit_locked(inst._ledger).elastic_committed == 0
    inst.detach()
