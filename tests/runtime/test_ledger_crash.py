"""No crash and no damage can brick a GPU's ledger (issue 16, items 1-4; issue 18, layout versions).

Real shared memory, real processes, real SIGKILL. A writer is killed at every write point of
a full engine lifetime in turn (the ``records.KILL_AT`` hook: the process kills itself just
before its N-th store), then a fresh process must attach, admit, commit, release, detach and
reclaim, and the totals must equal what the slots hold. Then random kill points over an
attach → admit → commit → release → detach loop (``KVPOLICY_TEST_LEDGER_KILLS``, default 40).
"""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import random
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime import layout as L
from kvpolicy.runtime import records
from kvpolicy.runtime.client import attach
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.errors import CorruptSegment, LayoutVersionMismatch, LedgerError, SlotsFull, TornSlot
from kvpolicy.runtime.ledger import GpuLedger, GpuLimits, InstanceLimits, Totals
from kvpolicy.runtime.segment import segment_path
from kvpolicy.units import GiB, MiB
from tests.runtime.ledger_helpers import slot_sums

CHUNK = 2 * MiB
FORK = mp.get_context("fork")
GPU = "cuda:0"
LIMITS = GpuLimits(capacity=80 * GiB, headroom=0, other_used=0, elastic_budget=32 * GiB)
KILLS = int(os.environ.get("KVPOLICY_TEST_LEDGER_KILLS") or 40)


# --- the processes -----------------------------------------------------------------------------------


def _run_in_child(target, *args) -> int:  # type: ignore[no-untyped-def]
    """Run ``target(*args)`` in a forked child; its exit code (−9: killed by SIGKILL)."""
    p = FORK.Process(target=target, args=args)
    p.start()
    p.join(timeout=120)
    assert p.exitcode is not None, f"{target.__name__} hung"
    return p.exitcode


def _leave_a_dead_holder(ledger_dir: Path, name: str) -> None:
    """Attach, hold static and elastic bytes, and die without detaching (the kernel drops the locks)."""
    inst = attach(model="dead", id=name, gpu=GPU, ledger_dir=ledger_dir, elastic=True, guarantee=GiB,
                  handle_signals=False)
    inst.admit_static(GiB)
    assert inst.admit(4 * CHUNK)
    inst.commit(4 * CHUNK)
    os._exit(0)  # no atexit: the slot stays, its owner gone


def _lifetime(ledger_dir: Path, kill_at: int) -> None:
    """Every kind of change an engine and a controller make, dying before its store number ``kill_at``."""
    records.KILL_AT = kill_at
    records._stores = 0
    _lifetime_body(ledger_dir)
    os._exit(0)


def _lifetime_store_count(ledger_dir: Path, out) -> None:  # type: ignore[no-untyped-def]
    records.KILL_AT = 1 << 62  # counts every store, kills at none
    records._stores = 0
    try:
        _lifetime_body(ledger_dir)
    finally:
        out.put(records.stores_made())


def _lifetime_body(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir)
    inst = attach(model="victim", id="victim", gpu=GPU, ledger_dir=ledger_dir, elastic=True, guarantee=GiB,
                  handle_signals=False)  # claim, after reclaiming the dead holder the test left
    inst.admit_static(2 * GiB)
    inst.report_pools({"kv": PoolFacts(owner="runtime", bytes=GiB)})
    assert inst.admit(3 * CHUNK)
    inst.commit(2 * CHUNK)
    inst.rollback(CHUNK)
    inst.release(CHUNK)
    inst.report(CHUNK, CHUNK)
    inst.acknowledge(1, "deferred")
    inst.touch()
    pid = os.fork()  # another engine attaches and dies holding bytes ...
    if pid == 0:
        records.KILL_AT = 0
        try:
            _leave_a_dead_holder(ledger_dir, "dead-b")
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    assert [v.id for v in ld.reclaim_dead()] == ["dead-b"]  # ... and the controller's tick reclaims it
    ld.publish(ld.read(), 2, {GPU: LIMITS}, {"victim": InstanceLimits(4 * GiB, 3 * GiB, 2 * GiB)})
    ld.heartbeat()
    inst.detach()


def _afterwards(ledger_dir: Path) -> None:
    """A fresh process: attach (reclaiming the dead), admit, commit, release, static admission, detach."""
    inst = attach(model="next", id="next", gpu=GPU, ledger_dir=ledger_dir, elastic=True, guarantee=GiB,
                  handle_signals=False)
    inst.admit_static(GiB)
    assert inst.admit(2 * CHUNK), inst.last_refusal
    inst.commit(2 * CHUNK)
    inst.release(2 * CHUNK)
    inst.detach()
    os._exit(0)


def _fresh_ledger(ledger_dir: Path) -> LedgerDir:
    ld = LedgerDir(ledger_dir, create=True)
    ld.gpu(GPU, create=True)
    ld.publish(ld.read(), 1, {GPU: LIMITS}, {})
    return ld


def _assert_whole(ld: LedgerDir, what: str) -> None:
    """After reclaim: no problem, no instance, every total zero, and the totals equal the slot sums."""
    ld.reclaim_dead()
    view = ld.read()
    state = view.gpus[GPU]
    assert view.problems == () and view.refused == {} and state.problems == (), f"{what}: {view.problems} {view.refused} {state.problems}"
    assert state.instances == () and state.dead == (), f"{what}: {state.instances} {state.dead}"
    led = ld.gpu(GPU)
    with led.change():  # the repair, if one is due, runs on the way in
        pass
    assert led.totals() == slot_sums(led) == Totals(0, 0, 0, 0, 0, 0), f"{what}: {led.totals()}"


# --- 1. kill -9 at every write point in turn ----------------------------------------------------------


def test_the_hook_kills_a_real_subprocess_at_the_chosen_store(ledger_dir: Path, child_env: dict[str, str]) -> None:
    """The environment variable arms the hook in a fresh interpreter: it dies at store 7, not before."""
    _fresh_ledger(ledger_dir).close()
    code = (
        "import sys; from kvpolicy.runtime.client import attach; from kvpolicy.runtime import records\n"
        f"attach(model='m', id='sub', gpu='{GPU}', ledger_dir=sys.argv[1], handle_signals=False)\n"
        "print('survived', records.stores_made())\n"
    )
    env = dict(child_env, **{records.KILL_AT_ENV: "7"})
    proc = subprocess.run([sys.executable, "-c", code, str(ledger_dir)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    env[records.KILL_AT_ENV] = str(1 << 40)
    proc = subprocess.run([sys.executable, "-c", code, str(ledger_dir)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and int(proc.stdout.split()[1]) > 7, proc.stdout + proc.stderr
    with LedgerDir(ledger_dir) as ld:
        _assert_whole(ld, "after the subprocess kills")


def test_a_kill_at_every_write_point_never_bricks_the_ledger(ledger_dir: Path) -> None:
    probe = ledger_dir.with_name("probe")
    ld = _fresh_ledger(probe)
    assert _run_in_child(_leave_a_dead_holder, probe, "dead-a") == 0
    out = FORK.Queue()
    assert _run_in_child(_lifetime_store_count, probe, out) == 0
    points = out.get(timeout=30)
    _assert_whole(ld, "a lifetime without kills")
    ld.close()
    assert points > 60, f"only {points} stores in a full lifetime?"
    for n in range(1, points + 1):
        where = ledger_dir.with_name(f"kill-{n}")
        ld = _fresh_ledger(where)
        assert _run_in_child(_leave_a_dead_holder, where, "dead-a") == 0
        assert _run_in_child(_lifetime, where, n) == -signal.SIGKILL, f"store {n} of {points} was not reached"
        torn = ld.read().gpus[GPU].problems  # by construction, not by repair: no reader ever sees a torn slot
        assert torn == (), f"killed before store {n}: {torn}"
        assert _run_in_child(_afterwards, where) == 0, f"killed before store {n}: the next engine failed"
        _assert_whole(ld, f"killed before store {n} of {points}")
        ld.close()
        for path in where.iterdir():  # the next run gets a fresh directory; keep tmpfs small
            path.unlink()
        where.rmdir()
    print(f"\nkilled before each of {points} stores in turn; the ledger recovered every time")


# --- 1b. random kills of an engine's loop ------------------------------------------------------------


def _engine_loop(ledger_dir: Path, kill_at: int, seed: int) -> None:
    records.KILL_AT = kill_at
    records._stores = 0
    rng = random.Random(seed)
    for i in range(1000):
        inst = attach(model="loop", id=f"loop-{seed}-{i}", gpu=GPU, ledger_dir=ledger_dir, elastic=True,
                      guarantee=rng.randint(0, 8) * CHUNK, handle_signals=False)
        inst.admit_static(rng.randint(1, 4) * 256 * MiB)
        k = rng.randint(1, 4) * CHUNK
        if inst.admit(k):
            inst.commit(k)
            inst.release(rng.randint(0, k // CHUNK) * CHUNK)
        inst.detach()
    os._exit(0)


def test_random_kills_of_an_attach_admit_commit_release_detach_loop_never_brick_it(ledger_dir: Path) -> None:
    """``KVPOLICY_TEST_LEDGER_KILLS`` kills (default 40), each at a random store of the loop; seeded."""
    ld = _fresh_ledger(ledger_dir)
    rng = random.Random(16)
    survivor_code = _run_in_child(_leave_a_dead_holder, ledger_dir, "dead-first")
    assert survivor_code == 0
    for k in range(KILLS):
        point = rng.randint(1, 600)
        assert _run_in_child(_engine_loop, ledger_dir, point, k) == -signal.SIGKILL, f"kill {k}: store {point}"
        assert ld.read().gpus[GPU].problems == (), f"kill {k} at store {point}: a torn slot"
        assert _run_in_child(_afterwards, ledger_dir) == 0, f"kill {k} (store {point}): the next engine failed"
        _assert_whole(ld, f"kill {k} at store {point}")
    ld.close()


# --- 2. one damaged segment, or slot, affects only its GPU -------------------------------------------


def _scribble(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def test_random_bytes_over_slots_are_reported_repaired_and_other_gpus_go_on(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    for g in ("cuda:0", "cuda:1"):
        ld.gpu(g, create=True, slots=4)
    ld.publish(ld.read(), 1, {g: LIMITS for g in ("cuda:0", "cuda:1")}, {})
    healthy = attach(model="m", id="healthy", gpu="cuda:1", ledger_dir=ledger_dir, slots=4, handle_signals=False)
    path = segment_path(ledger_dir, "cuda:0")
    rng = random.Random(2)
    for i in range(4):  # every slot, identity and sequence words included; one with epoch 2⁶⁴ − 1
        _scribble(path, L.slot_offset(i), rng.randbytes(L.SLOT_END))
    ident = L.slot_offset(0)  # the slot the next claim takes: its epoch + 1 must wrap, not overflow
    body = struct.pack(L.IDENTITY_RECORD.body_format, 0, 0, (1 << 64) - 1, 0, 0, 0, 0, 0, 0, b"", b"", b"", b"")
    copy = body + b"\0" * (L.IDENTITY_RECORD.copy_size - 8 - len(body)) + struct.pack("<Q", zlib.crc32(body))
    _scribble(path, ident, struct.pack("<Q", 0) + copy)  # a valid free identity whose epoch is the field's max
    view = ld.read()
    assert any(str(path) in p for p in view.gpus["cuda:0"].problems), view.gpus["cuda:0"].problems
    assert [v.id for v in view.gpus["cuda:1"].instances] == ["healthy"]
    ld.reclaim_dead()  # wipes the damaged slots nobody holds
    inst = attach(model="m", id="after", gpu="cuda:0", ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert inst.slot == 0 and inst.snapshot().epoch == 0  # 2⁶⁴ − 1 + 1, wrapped
    assert inst.admit_static(GiB) == GiB
    view = ld.read()
    assert view.gpus["cuda:0"].problems == () and [v.id for v in view.gpus["cuda:0"].instances] == ["after"]
    led = ld.gpu("cuda:0")
    assert led.totals() == slot_sums(led)
    inst.detach()
    healthy.detach()
    ld.close()


def test_a_torn_slot_is_reported_at_once_not_after_a_thousand_retries(ledger_dir: Path) -> None:
    led = GpuLedger.open(ledger_dir, GPU, slot_count=2)
    claim = led.claim(id="a", model="m", engine="e", engine_id=None, rank=0, guarantee=0, elastic=False)
    rec = led.records.slots[claim.index].usage
    with led.seg.locked():
        _, u = rec.read(led.seg.mm, led.seg.words)
        rec.write(led.seg.mm, led.seg.words, u._replace(epoch=u.epoch + 5))  # a record of another occupant
    reads_before = led.seg.words[rec.seq_index]
    with pytest.raises(TornSlot, match="records of different occupants"):
        led.slot(claim.index)
    assert led.seg.words[rec.seq_index] == reads_before
    led.close()


def _hold_a_slot(ledger_dir: Path, ready, done) -> None:  # type: ignore[no-untyped-def]
    inst = attach(model="m", id="holder", gpu=GPU, ledger_dir=ledger_dir, slots=4, handle_signals=False)
    inst.admit_static(GiB)
    os.write(ready, b"x")
    os.read(done, 1)
    os._exit(0)


def test_a_damaged_slot_whose_owner_lives_is_over_counted_until_it_goes(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    led = ld.gpu(GPU, create=True, slots=4)
    ld.publish(ld.read(), 1, {GPU: LIMITS}, {})
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    p = FORK.Process(target=_hold_a_slot, args=(ledger_dir, w1, r2), daemon=True)
    p.start()
    assert os.read(r1, 1) == b"x"
    (holder,) = ld.read().instances()
    # its identity record, sequence word and both copies (a process's record cache follows the sequence word)
    _scribble(segment_path(ledger_dir, GPU), L.slot_offset(holder.index), b"\xa5" * L.IDENTITY_RECORD.size)
    led.seg.words[L.OFF_DIRTY // 8] = 12345  # and a writer died inside a change: the rebuild must not under-count
    other = attach(model="m", id="other", gpu=GPU, ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert led.totals().runtime_reserved >= GiB  # the damaged slot's gigabyte is still counted
    assert ld.read().gpus[GPU].problems  # and reported
    os.write(w2, b"x")
    p.join(timeout=60)
    ld.reclaim_dead()  # owner gone: the slot is wiped and the totals exact
    assert ld.read().gpus[GPU].problems == ()
    assert led.totals() == slot_sums(led) and led.totals().runtime_reserved == 0
    other.detach()
    ld.close()


def test_a_truncated_segment_is_moved_aside_and_replaced_and_other_gpus_go_on(ledger_dir: Path) -> None:
    ld = LedgerDir(ledger_dir, create=True)
    for g in ("cuda:0", "cuda:1"):
        ld.gpu(g, create=True, slots=4)
    ld.publish(ld.read(), 1, {g: LIMITS for g in ("cuda:0", "cuda:1")}, {})
    path = segment_path(ledger_dir, "cuda:0")
    os.truncate(path, 100)  # while the controller has it mapped: touching it would be SIGBUS
    assert ld.reclaim_dead() == []
    ld.heartbeat()
    view = ld.read()
    assert "cuda:1" in view.gpus
    assert any("cuda:0" in p and "truncated" in p for p in view.problems), view.problems
    aside = [p.name for p in ledger_dir.iterdir() if p.name.startswith("cuda:0.ledger.")]
    assert len(aside) == 1 and aside[0].startswith("cuda:0.ledger.truncated-"), aside
    inst = attach(model="m", id="fresh", gpu="cuda:0", ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert [v.id for v in ld.read().gpus["cuda:0"].instances] == ["fresh"]
    inst.detach()
    ld.close()


def test_a_damaged_segment_in_use_is_refused_not_moved(ledger_dir: Path) -> None:
    holder = attach(model="m", id="holder", gpu=GPU, ledger_dir=ledger_dir, slots=4, handle_signals=False)
    path = segment_path(ledger_dir, GPU)
    _scribble(path, 0, b"BROKEN!!")
    with pytest.raises(CorruptSegment, match=f"{path}.*not a kvpolicy ledger"):
        attach(model="m", id="second", gpu=GPU, ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert path.exists() and [p.name for p in ledger_dir.iterdir() if ".ledger." in p.name] == []
    holder.detach()


# --- 3. no spurious SlotsFull -------------------------------------------------------------------------


def test_claim_takes_the_next_free_slot_while_a_detacher_still_holds_one(ledger_dir: Path) -> None:
    """A free slot whose owner lock another open file still holds (a detach finishing) is skipped."""
    led = GpuLedger.open(ledger_dir, GPU, slot_count=2)
    detacher = GpuLedger.open(ledger_dir, GPU, create=False)
    assert detacher.owners.take(0)  # slot 0 is free, but its last owner has not dropped the lock yet
    claim = led.claim(id="a", model="m", engine="e", engine_id=None, rank=0, guarantee=0, elastic=False)
    assert claim.index == 1
    with pytest.raises(SlotsFull):  # the only other slot is still held: now the GPU is full for real
        led.claim(id="b", model="m", engine="e", engine_id=None, rank=0, guarantee=0, elastic=False)
    detacher.close()
    assert led.claim(id="b", model="m", engine="e", engine_id=None, rank=0, guarantee=0, elastic=False).index == 0
    led.close()


def _churn(ledger_dir: Path, n: int, rounds: int, out) -> None:  # type: ignore[no-untyped-def]
    full = 0
    for i in range(rounds):
        try:
            attach(model="m", id=f"churn-{n}-{i}", gpu=GPU, ledger_dir=ledger_dir, slots=2,
                   handle_signals=False).detach()
        except SlotsFull:
            full += 1
    out.put(full)


def test_two_processes_churning_on_two_slots_are_never_refused(ledger_dir: Path) -> None:
    """Each holds at most one of the two slots, so every SlotsFull would be spurious."""
    GpuLedger.open(ledger_dir, GPU, slot_count=2).close()
    out = FORK.Queue()
    procs = [FORK.Process(target=_churn, args=(ledger_dir, n, 300, out)) for n in range(2)]
    for p in procs:
        p.start()
    refusals = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert refusals == [0, 0]


# --- 4. a full tmpfs ---------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 64 KiB tmpfs (a segment needs 260 KiB); root only (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(where)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_tmpfs_is_a_clear_enospc_error_and_leaves_no_file(small_tmpfs: Path) -> None:
    ledger_dir = small_tmpfs / "ledger"
    with pytest.raises(LedgerError, match=r"no room for cuda:0's segment in .*small/ledger \(ENOSPC.*--ledger-dir"):
        attach(model="m", id="a", gpu=GPU, ledger_dir=ledger_dir, handle_signals=False)
    assert list(ledger_dir.iterdir()) == []  # no temporary file, no half segment


def test_run_once_on_a_full_tmpfs_prints_the_error_without_a_traceback(small_tmpfs: Path, tmp_path: Path,
                                                                      child_env: dict[str, str]) -> None:
    ledger_dir = small_tmpfs / "ledger"
    os.mkdir(ledger_dir, 0o700)
    filler = small_tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)  # fill it: not even a small file has room
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    policy = tmp_path / "policy.kvp"
    policy.write_text('version 1\ngpu * {\n  headroom 1 GiB\n}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "kvpolicy.cli", "run", str(policy), "--once", "--ledger-dir", str(ledger_dir),
         "--gpu-capacity", "80GiB"],
        env=child_env, capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1 and "ENOSPC" in proc.stderr, proc.stderr


# --- 5. figures the ledger cannot hold ---------------------------------------------------------------


def test_a_capacity_past_64_bits_is_refused_at_the_flag(ledger_dir: Path, tmp_path: Path,
                                                       child_env: dict[str, str]) -> None:
    policy = tmp_path / "policy.kvp"
    policy.write_text('version 1\ngpu * {\n  headroom 1 GiB\n}\n')
    attach(model="m", id="a", gpu=GPU, ledger_dir=ledger_dir, handle_signals=False).detach()
    proc = subprocess.run(
        [sys.executable, "-m", "kvpolicy.cli", "run", str(policy), "--once", "--ledger-dir", str(ledger_dir),
         "--gpu-capacity", "20000000TiB"],
        env=child_env, capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in proc.stderr and "struct.error" not in proc.stderr, proc.stderr
    # the flag's own bound (sizes stop at 1 EiB) refuses it before the ledger's 64-bit one could
    assert proc.returncode == 2 and "--gpu-capacity" in proc.stderr and "too large" in proc.stderr, proc.stderr


def test_limits_past_64_bits_are_refused_before_any_store(ledger_dir: Path) -> None:
    with pytest.raises(LedgerError, match="capacity of 18446744073709551616 B is outside"):
        GpuLimits(capacity=1 << 64, headroom=0, other_used=0, elastic_budget=0)
    with pytest.raises(LedgerError, match="limit of -1 B"):
        InstanceLimits(-1, 0, 0)
    inst = attach(model="m", id="a", gpu=GPU, ledger_dir=ledger_dir, handle_signals=False)
    with pytest.raises(LedgerError, match="capacity of"):
        inst.admit_static(GiB, capacity=1 << 70)
    with pytest.raises(LedgerError, match="used of"):
        inst.report(1 << 64, 0)
    inst.detach()


# --- 6. permissions ----------------------------------------------------------------------------------


def test_a_segment_with_any_other_bit_is_refused_even_in_a_0705_directory(ledger_dir: Path) -> None:
    GpuLedger.open(ledger_dir, GPU, slot_count=2).close()
    os.chmod(ledger_dir, 0o705)
    os.chmod(segment_path(ledger_dir, GPU), 0o604)
    with pytest.raises(LedgerError, match=r"open to every user .*mode 0604"):
        GpuLedger.open(ledger_dir, GPU, create=False)
    os.chmod(segment_path(ledger_dir, GPU), 0o600)
    GpuLedger.open(ledger_dir, GPU, create=False).close()  # the 0705 directory itself is fine: o+w is what's refused


# --- 7. layout versions (issue 18) -------------------------------------------------------------------


def _write_segment_of_version(ledger_dir: Path, gpu: str, version: int) -> Path:
    """A segment as another kvpolicy would write it: this layout with another version number."""
    GpuLedger.open(ledger_dir, gpu, slot_count=4).close()
    path = segment_path(ledger_dir, gpu)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, version)
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, zlib.crc32(bytes(data[: L.HEADER_STATIC_SIZE])))
    path.write_bytes(bytes(data))
    return path


LAYOUT2_HEADER = "<8sIIIIQ32sQI"
"""Layout 2's static header: a 32-byte GPU id, the CRC at 76. Its records had today's offsets."""


def _write_layout2_segment(ledger_dir: Path, gpu: str) -> Path:
    """A segment as kvpolicy of layout 2 wrote it: its header (this layout's records, at the offsets layout 2 had)."""
    GpuLedger.open(ledger_dir, gpu, slot_count=4).close()
    path = segment_path(ledger_dir, gpu)
    data = bytearray(path.read_bytes())
    data[: L.HEADER_CRC_OFFSET + 4] = bytes(L.HEADER_CRC_OFFSET + 4)
    struct.pack_into(LAYOUT2_HEADER, data, 0, L.MAGIC, 2, L.HEADER_SIZE, 4, L.SLOT_SIZE, L.segment_size(4),
                     gpu.encode(), 1, os.geteuid())
    struct.pack_into("<I", data, 76, zlib.crc32(bytes(data[:76])))
    path.write_bytes(bytes(data))
    return path


def _old_engine_holding(path_dir: Path, gpu: str, ready, done) -> None:  # type: ignore[no-untyped-def]
    """An engine of the previous layout: it holds slot 0's owner lock (the same lock bytes in every version)."""
    import fcntl

    fd = os.open(segment_path(path_dir, gpu), os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, L.LOCK_SLOT_BASE, 1, 0))
    os.write(ready, b"x")
    os.read(done, 1)
    os._exit(0)


def test_an_old_engine_beside_a_new_controller_says_upgrade_the_engines(ledger_dir: Path) -> None:
    old = L.LAYOUT_VERSION - 1
    assert old == 2  # the segment below is written as layout 2 wrote it
    path = _write_layout2_segment(ledger_dir, "cuda:0")
    GpuLedger.open(ledger_dir, "cuda:1", slot_count=4).close()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    p = FORK.Process(target=_old_engine_holding, args=(ledger_dir, "cuda:0", w1, r2), daemon=True)
    p.start()
    assert os.read(r1, 1) == b"x"
    ld = LedgerDir(ledger_dir)
    view = ld.read()
    assert view.problems == () and list(view.refused) == ["cuda:0"]
    problem = view.refused["cuda:0"]
    assert f"layout version {old}, older than this kvpolicy" in problem and "upgrade the engines" in problem
    assert "cuda:1" in view.gpus  # the other GPU goes on
    with pytest.raises(LayoutVersionMismatch, match="upgrade the engines still attached"):
        attach(model="m", id="new", gpu="cuda:0", ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert path.exists()  # in use by the old engine: never moved
    os.write(w2, b"x")
    p.join(timeout=60)
    # the old engine is gone: the next new engine moves the old segment aside and starts a new one
    inst = attach(model="m", id="new", gpu="cuda:0", ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert [q.name.split("-")[0] for q in ledger_dir.iterdir() if ".ledger." in q.name] == [f"cuda:0.ledger.layout{old}"]
    assert [v.id for v in ld.read().gpus["cuda:0"].instances] == ["new"]
    inst.detach()
    ld.close()


def test_a_new_engine_beside_an_old_controller_says_upgrade_this_one(ledger_dir: Path) -> None:
    """A segment of a newer layout (written by newer engines) is refused by this older side, never moved."""
    newer = L.LAYOUT_VERSION + 1
    path = _write_segment_of_version(ledger_dir, GPU, newer)
    with pytest.raises(LayoutVersionMismatch, match=f"layout version {newer}, newer than this kvpolicy .*upgrade this "
                                                    "process's kvpolicy"):
        attach(model="m", id="old", gpu=GPU, ledger_dir=ledger_dir, slots=4, handle_signals=False)
    with LedgerDir(ledger_dir) as ld:
        view = ld.read()
        assert view.problems == () and list(view.refused) == [GPU]
        problem = view.refused[GPU]
        assert "newer than this kvpolicy" in problem and "upgrade this process" in problem
        assert ld.reclaim_dead() == []
    assert path.exists() and [q for q in ledger_dir.iterdir() if ".ledger." in q.name] == []


def test_an_engine_keyed_by_uuid_is_refused_while_a_layout_2_engine_holds_its_cuda_n_segment(
        ledger_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Layout 2 keyed a GPU by ``cuda:N`` and layout 3 by UUID: another file, so the version check alone
    would let engines of both layouts share the GPU unaccounted. The index twin is checked too."""
    from tests.support import fake_nvml

    uuids = ["GPU-5a0e4f2c-1b3d-4e5f-8a9b-0c1d2e3f4a5b", "GPU-9c7d1e2f-3a4b-4c5d-9e6f-7a8b9c0d1e2f"]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.module([fake_nvml.FakeGpu(u) for u in uuids]))
    path = _write_layout2_segment(ledger_dir, "cuda:1")  # the old engines' name for uuids[1]
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    p = FORK.Process(target=_old_engine_holding, args=(ledger_dir, "cuda:1", w1, r2), daemon=True)
    p.start()
    assert os.read(r1, 1) == b"x"
    with pytest.raises(LayoutVersionMismatch, match=r"cuda:1.ledger has layout version 2, older than this kvpolicy .*"
                                                     "upgrade the engines still attached to this GPU"):
        attach(model="m", id="new", gpu=uuids[1], ledger_dir=ledger_dir, slots=4, handle_signals=False)
    other = attach(model="m", id="other", gpu=uuids[0], ledger_dir=ledger_dir, slots=4, handle_signals=False)
    assert not segment_path(ledger_dir, uuids[1]).exists() and path.exists()
    os.write(w2, b"x")
    p.join(timeout=60)
    inst = attach(model="m", id="new", gpu=uuids[1], ledger_dir=ledger_dir, slots=4, handle_signals=False)
    with LedgerDir(ledger_dir) as ld:  # the controller moves the drained old segment aside
        view = ld.read()
        assert {g: [v.id for v in s.instances] for g, s in view.gpus.items()} == {uuids[0]: ["other"], uuids[1]: ["new"]}
    assert [q.name.split("-")[0] for q in ledger_dir.iterdir() if ".ledger." in q.name] == ["cuda:1.ledger.layout2"]
    inst.detach()
    other.detach()


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "too big", "o+r"])
def test_a_status_file_that_is_not_one_is_refused_clearly(ledger_dir: Path, kind: str,
                                                        child_env: dict[str, str]) -> None:
    from kvpolicy.runtime.status import MAX_STATUS_BYTES, STATUS_FILE, read_status

    LedgerDir(ledger_dir, create=True).close()
    path = ledger_dir / STATUS_FILE
    if kind == "symlink to /dev/zero":
        os.symlink("/dev/zero", path)
        expected = "is a symlink"
    elif kind == "too big":
        with open(path, "wb") as f:
            f.truncate(MAX_STATUS_BYTES + 1)  # sparse: costs nothing, reading it all would
        os.chmod(path, 0o600)
        expected = "more than a status file can be"
    else:
        path.write_text("{}")
        os.chmod(path, 0o604)
        expected = "open to every user"
    with pytest.raises(LedgerError, match=expected):
        read_status(ledger_dir)
    proc = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "status", "--ledger-dir", str(ledger_dir)],
                          env=child_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
