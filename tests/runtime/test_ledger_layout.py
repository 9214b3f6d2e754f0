"""The binary layout and the two-copy records."""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

import pytest

from kvpolicy.runtime import layout as L
from kvpolicy.runtime.errors import CorruptSegment
from kvpolicy.runtime.records import Record

DOC = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"


def test_every_record_fits_and_every_word_is_aligned() -> None:
    assert L.OFF_TOTALS_RECORD + L.TOTALS_RECORD.size <= L.HEADER_SIZE
    assert L.SLOT_END <= L.SLOT_SIZE
    for spec in (L.GPU_RECORD, L.TOTALS_RECORD, L.IDENTITY_RECORD, L.PUBLISHED_RECORD, L.USAGE_RECORD, L.RESERVATION_RECORD):
        assert spec.copy_size % 8 == 0, spec.name
        assert spec.size == 8 + 2 * spec.copy_size
    for off in (L.OFF_GENERATION, L.OFF_HEARTBEAT, L.OFF_DIRTY, L.OFF_GPU_RECORD, L.OFF_TOTALS_RECORD):
        assert off % 8 == 0
    assert L.HEADER_STATIC_SIZE + 4 <= L.OFF_GENERATION


def test_layout_v3_is_frozen() -> None:
    """Changing any offset or size, or the order of a change's stores, is a new layout version: v3 is this.

    v2 kept v1's offsets and changed the protocol: a free stores the identity first (a v1 writer
    killed half-way left slots no v2 reader accepts), so the two never share a segment. v3 widened
    the GPU id from 32 to 64 bytes for UUIDs (issue 18), which moved the header fields after it;
    the records kept their offsets.
    """
    assert (L.MAGIC, L.LAYOUT_VERSION, L.HEADER_SIZE, L.SLOT_SIZE) == (b"KVPLEDGR", 3, 4096, 4096)
    assert (L.GPU_ID_WIDTH, L.OFF_GPU_ID, L.OFF_CREATED_AT, L.OFF_CREATOR_UID, L.HEADER_CRC_OFFSET) == (64, 32, 96, 104, 108)
    assert (L.OFF_GPU_RECORD, L.OFF_TOTALS_RECORD) == (192, 360)
    assert (L.SLOT_OFF_PUBLISHED, L.SLOT_OFF_USAGE, L.SLOT_OFF_ACTIVITY, L.SLOT_OFF_RESERVATION) == (552, 672, 824, 832)
    assert L.RESERVATION_RECORD.size == 2776


def test_a_uuid_is_stored_whole_in_the_header(tmp_path: Path) -> None:
    from kvpolicy.runtime.segment import check_header, pack_header

    uuid = "MIG-7e0b5d1a-2c3f-5e4d-8b6a-1f0e9d8c7b6a"
    head = pack_header(uuid, 4)
    assert head[L.OFF_GPU_ID:L.OFF_GPU_ID + L.GPU_ID_WIDTH].rstrip(b"\0") == uuid.encode()
    assert check_header(head, tmp_path / f"{uuid}.ledger", uuid, L.segment_size(4)) == 4
    with pytest.raises(CorruptSegment, match=r"belongs to GPU 'MIG-7e0b.*', not 'cuda:0'"):
        check_header(head, tmp_path / "cuda:0.ledger", "cuda:0", L.segment_size(4))


def test_docs_carry_the_generated_layout_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert L.layout_table() in text, "docs/ledger.md's layout table is out of date: paste layout.layout_table()"


def test_pools_fit_deepseek_v4_and_other() -> None:
    names = ["swa", "c4", "c128", "indexer", "compressor_state", "other"]
    assert len(names) <= L.MAX_POOLS
    assert all(len(n.encode()) <= L.POOL_NAME_WIDTH for n in names)


@pytest.fixture
def region():
    mm = mmap.mmap(-1, 4096)
    words = memoryview(mm).cast("Q")
    yield mm, words
    words.release()
    mm.close()


def test_record_round_trip_and_seq_moves_once_per_write(region) -> None:
    mm, words = region
    rec = Record(L.PUBLISHED_RECORD, 64, "test")
    rec.initialise(mm, words, rec.zero())
    s0 = rec.seq(words)
    rec.write(mm, words, rec.make(epoch=3, revision=7, limit=10, target=9, guarantee=1, published_at_ns=5))
    assert rec.seq(words) == s0 + 1
    fresh = Record(L.PUBLISHED_RECORD, 64, "test")  # another process: no cached read
    seq, v = fresh.read(mm, words)
    assert seq == s0 + 1 and (v.limit, v.target, v.revision) == (10, 9, 7)


def test_a_writer_killed_half_way_leaves_the_previous_copy_visible(region) -> None:
    """The writer fills the invisible copy first; if it dies before the seq store, readers see the old copy."""
    mm, words = region
    rec = Record(L.PUBLISHED_RECORD, 64, "test")
    rec.initialise(mm, words, rec.zero())
    rec.write(mm, words, rec.make(epoch=1, revision=1, limit=100, target=50, guarantee=10, published_at_ns=1))
    seq = rec.seq(words)
    invisible = 64 + 8 + ((seq & 1) ^ 1) * L.PUBLISHED_RECORD.copy_size
    mm[invisible : invisible + 20] = b"\xff" * 20  # a torn write of the next revision
    seq2, v = Record(L.PUBLISHED_RECORD, 64, "test").read(mm, words)
    assert seq2 == seq and (v.revision, v.limit) == (1, 100)
    # the next writer overwrites the torn copy whole and makes it visible
    rec.write(mm, words, rec.make(epoch=1, revision=2, limit=80, target=40, guarantee=10, published_at_ns=2))
    _, v = Record(L.PUBLISHED_RECORD, 64, "test").read(mm, words)
    assert (v.revision, v.limit) == (2, 80)


def test_a_damaged_visible_copy_fails_its_crc(region) -> None:
    mm, words = region
    rec = Record(L.USAGE_RECORD, 128, "segment X slot 0")
    rec.initialise(mm, words, rec.zero())
    seq = rec.seq(words)
    visible = 128 + 8 + (seq & 1) * L.USAGE_RECORD.copy_size
    mm[visible + 8 : visible + 16] = struct.pack("<Q", 1 << 40)  # someone scribbled "used"
    with pytest.raises(CorruptSegment, match=re.escape("segment X slot 0: the usage record")):
        Record(L.USAGE_RECORD, 128, "segment X slot 0").read(mm, words)
