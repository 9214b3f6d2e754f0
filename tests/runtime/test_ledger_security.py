"""Who may create, open and trust a segment: permissions, owners, groups, foreign and damaged files."""

from __future__ import annotations

import os
import shutil
import stat
import struct
import traceback
import zlib
from pathlib import Path

import pytest

from kvpolicy.runtime import layout as L
from kvpolicy.runtime.errors import (
    CorruptSegment,
    ForeignSegment,
    LayoutVersionMismatch,
    UnsafeSegment,
)
from kvpolicy.runtime.ledger import GpuLedger
from kvpolicy.runtime.segment import Access, segment_path

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_directory_0700_and_segment_0600_by_default(ledger_dir: Path) -> None:
    led = GpuLedger.open(ledger_dir, "cuda:0")
    try:
        assert mode(ledger_dir) == 0o700
        seg = segment_path(ledger_dir, "cuda:0")
        assert mode(seg) == 0o600
        assert os.stat(seg).st_uid == os.geteuid()
        assert os.stat(seg).st_size == L.segment_size(L.DEFAULT_SLOTS)
        assert [p.name for p in ledger_dir.iterdir()] == ["cuda:0.ledger"]  # no temporary file left
    finally:
        led.close()


def test_group_makes_directory_2770_and_segment_0660_of_that_group(ledger_dir: Path) -> None:
    gid = os.getegid() if os.geteuid() != 0 else 100  # root may give files to any group
    led = GpuLedger.open(ledger_dir, "cuda:0", Access(group=gid))
    try:
        seg = segment_path(ledger_dir, "cuda:0")
        assert mode(ledger_dir) == 0o2770 and os.stat(ledger_dir).st_gid == gid
        assert mode(seg) == 0o660 and os.stat(seg).st_gid == gid
    finally:
        led.close()


def _create_as(uid: int, gid: int, directory: Path, access: Access | None = None) -> None:
    """Create the cuda:0 segment from a child process running as ``uid``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.setgid(gid)
            os.setuid(uid)
            GpuLedger.open(directory, "cuda:0", access or Access()).close()
            code = 0
        except BaseException:  # noqa: BLE001 - the child prints why, the parent asserts its exit code
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@root_only
def test_segment_created_by_another_uid_is_refused(ledger_dir: Path) -> None:
    os.chmod(ledger_dir.parent, 0o755)  # let the other user reach the ledger directory
    ledger_dir.mkdir()
    os.chown(ledger_dir, os.geteuid(), NOBODY)  # our directory, writable by the other user's group
    os.chmod(ledger_dir, 0o770)
    _create_as(NOBODY, NOBODY, ledger_dir, Access(group=NOBODY))
    assert os.stat(segment_path(ledger_dir, "cuda:0")).st_uid == NOBODY
    with pytest.raises(ForeignSegment) as err:
        GpuLedger.open(ledger_dir, "cuda:0")
    msg = str(err.value)
    assert "the segment" in msg and f"uid {NOBODY}" in msg and f"uid {os.geteuid()}" in msg
    assert "allow_foreign_owner" in msg


@root_only
def test_directory_of_another_uid_is_refused(ledger_dir: Path) -> None:
    ledger_dir.mkdir(mode=0o755)
    os.chown(ledger_dir, NOBODY, NOBODY)
    with pytest.raises(ForeignSegment, match=r"the ledger directory .* is owned by uid 65534"):
        GpuLedger.open(ledger_dir, "cuda:0")


@root_only
def test_foreign_segment_is_trusted_when_configured(ledger_dir: Path) -> None:
    os.chmod(ledger_dir.parent, 0o755)  # let the other user reach the ledger directory
    ledger_dir.mkdir(mode=0o755)
    os.chown(ledger_dir, NOBODY, NOBODY)
    _create_as(NOBODY, NOBODY, ledger_dir)
    led = GpuLedger.open(ledger_dir, "cuda:0", Access(allow_foreign_owner=True))
    assert led.totals().active == 0
    led.close()


@root_only
def test_segment_of_the_configured_group_is_trusted(ledger_dir: Path) -> None:
    gid = 100
    os.chmod(ledger_dir.parent, 0o755)  # let the other user reach the ledger directory
    ledger_dir.mkdir(mode=0o755)
    os.chown(ledger_dir, NOBODY, gid)
    os.chmod(ledger_dir, 0o2770)
    _create_as(NOBODY, gid, ledger_dir, Access(group=gid))
    assert mode(segment_path(ledger_dir, "cuda:0")) == 0o660
    led = GpuLedger.open(ledger_dir, "cuda:0", Access(group=gid))
    led.close()
    with pytest.raises(ForeignSegment, match="not the configured gid 4242"):
        GpuLedger.open(ledger_dir, "cuda:0", Access(group=4242))


def _write(path: Path, data: bytes, file_mode: int = 0o600) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, file_mode)


def test_wrong_magic_is_refused(ledger_dir: Path) -> None:
    _write(segment_path(ledger_dir, "cuda:0"), b"NOTALEDG" + bytes(L.segment_size(4) - 8))
    with pytest.raises(CorruptSegment, match=r"not a kvpolicy ledger segment .*b'NOTALEDG'"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_short_file_is_refused(ledger_dir: Path) -> None:
    _write(segment_path(ledger_dir, "cuda:0"), b"hello")
    with pytest.raises(CorruptSegment, match="5 bytes, shorter than a ledger header"):
        GpuLedger.open(ledger_dir, "cuda:0")


def _patch_header(path: Path, offset: int, fmt: str, value: object) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, zlib.crc32(bytes(data[: L.HEADER_STATIC_SIZE])))
    path.write_bytes(bytes(data))


def test_other_layout_version_is_refused_naming_both(ledger_dir: Path) -> None:
    GpuLedger.open(ledger_dir, "cuda:0", slot_count=4).close()
    path = segment_path(ledger_dir, "cuda:0")
    _patch_header(path, 8, "<I", 7)
    with pytest.raises(LayoutVersionMismatch, match=f"layout version 7, newer than this kvpolicy .* \\(layout version {L.LAYOUT_VERSION}\\): upgrade this process"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_damaged_header_fails_its_crc(ledger_dir: Path) -> None:
    GpuLedger.open(ledger_dir, "cuda:0", slot_count=4).close()
    path = segment_path(ledger_dir, "cuda:0")
    data = bytearray(path.read_bytes())
    data[16] ^= 0x01  # slot_count, without fixing the CRC
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegment, match="header fails its CRC"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_truncated_segment_is_refused(ledger_dir: Path) -> None:
    GpuLedger.open(ledger_dir, "cuda:0", slot_count=4).close()
    path = segment_path(ledger_dir, "cuda:0")
    os.truncate(path, L.segment_size(3))
    with pytest.raises(CorruptSegment, match="inconsistent sizes"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_renamed_segment_is_refused(ledger_dir: Path) -> None:
    GpuLedger.open(ledger_dir, "cuda:0", slot_count=4).close()
    os.rename(segment_path(ledger_dir, "cuda:0"), segment_path(ledger_dir, "cuda:1"))
    with pytest.raises(CorruptSegment, match="belongs to GPU 'cuda:0', not 'cuda:1'"):
        GpuLedger.open(ledger_dir, "cuda:1")


def test_world_accessible_segment_is_refused(ledger_dir: Path) -> None:
    GpuLedger.open(ledger_dir, "cuda:0", slot_count=4).close()
    os.chmod(segment_path(ledger_dir, "cuda:0"), 0o666)
    with pytest.raises(UnsafeSegment, match="writable by every user"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_symlinked_segment_is_refused(ledger_dir: Path, tmp_path: Path) -> None:
    GpuLedger.open(ledger_dir, "cuda:0", slot_count=4).close()
    real = segment_path(ledger_dir, "cuda:0")
    shutil.move(real, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", real)
    with pytest.raises(UnsafeSegment, match="symlink"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_symlinked_directory_is_refused(ledger_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", ledger_dir)
    with pytest.raises(UnsafeSegment, match="is a symlink"):
        GpuLedger.open(ledger_dir, "cuda:0")


def test_damaged_slot_is_reported_not_trusted(ledger_dir: Path) -> None:
    from kvpolicy.runtime.client import attach

    inst = attach(model="m", gpu="cuda:0", ledger_dir=ledger_dir, slots=4, handle_signals=False)
    try:
        led = GpuLedger.open(ledger_dir, "cuda:0")
        ident = led.records.slots[inst.slot].identity
        visible = ident.offset + 8 + (ident.seq(led.seg.words) & 1) * L.IDENTITY_RECORD.copy_size
        led.seg.mm[visible + 70] ^= 0xFF  # flip a byte of the instance id
        views, problems = led.slots()
        assert views == [] and len(problems) == 1 and "identity record" in problems[0] and "CRC" in problems[0]
        led.close()
    finally:
        inst._attached = False  # its slot is damaged on purpose; do not try to free it
        inst._ledger.close()


@pytest.mark.parametrize(
    "gpu, problem",
    [("", "1 to 64 bytes"), ("../etc", "may hold only"), (".hidden", "must not start with '.'"), ("x" * 65, "1 to 64 bytes"),
     ("MIG-GPU-5a0e4f2c-1b3d-4e5f-8a9b-0c1d2e3f4a5b/1/0", "may hold only")],
)
def test_gpu_ids_that_cannot_name_a_file_are_refused(ledger_dir: Path, gpu: str, problem: str) -> None:
    from kvpolicy.runtime.errors import LedgerError

    with pytest.raises(LedgerError, match=problem):
        GpuLedger.open(ledger_dir, gpu)
