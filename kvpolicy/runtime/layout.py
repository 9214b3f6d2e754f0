"""The binary layout of a ledger segment (layout version 3): offsets, records, field widths.

A segment is one file per GPU: a header of ``HEADER_SIZE`` bytes, then ``slot_count``
slots of ``SLOT_SIZE`` bytes. All integers are little-endian and every field that is
read or written on its own (a sequence counter, the generation, a timestamp) is an
8-byte word at an 8-byte aligned offset, so one load or store moves it whole.

Multi-field data lives in *records*. A record is a sequence word followed by two
copies of its body; the parity of the sequence word says which copy is visible
(see ``kvpolicy.runtime.records``). Each copy ends with the CRC-32 of its body, so
a copy that was never written, or was overwritten by something that is not the
ledger, is detected instead of trusted.

Nothing here does I/O: this module is the layout, written once, and the table in
``docs/ledger.md`` is generated from it (``layout_table()``; a test keeps them equal).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"KVPLEDGR"
LAYOUT_VERSION = 3
HEADER_SIZE = 4096
SLOT_SIZE = 4096
DEFAULT_SLOTS = 64
MAX_SLOTS = 1024

# Fixed widths of strings (UTF-8 bytes, NUL padded, no NUL inside).
GPU_ID_WIDTH = 64
"""A GPU id: a UUID (``GPU-`` or ``MIG-`` and 36 characters, 40 bytes) or a fallback ``cuda:N``.
Layout 3 widened it from layout 2's 32 bytes, which moved the header fields after it."""
ID_WIDTH = 64
MODEL_WIDTH = 64
ENGINE_WIDTH = 16
ENGINE_ID_WIDTH = 64
POOL_NAME_WIDTH = 24
PART_NAME_WIDTH = 24
MAX_POOLS = 8
"""Pools per slot: DeepSeek-V4's five runtime pools, ``other``, and room for two more."""
MAX_PARTS = 24
"""Parts (``PoolFacts.parts``) per slot, over all its pools."""

NONE_U64 = 0xFFFF_FFFF_FFFF_FFFF
"""An unsigned field's "not given" (e.g. a pool whose tensor bytes are unknown)."""
WAITING_UNIT = 1 << 20
"""The usage record keeps ``waiting`` in whole MiB, rounded up (a u32: at most ``WAITING_MAX`` of them)."""
WAITING_MAX = 0xFFFF_FFFF

# Slot states (identity record).
SLOT_FREE = 0
SLOT_ACTIVE = 1

# Identity flags.
FLAG_ELASTIC = 1

# Acknowledgement status (usage record).
ACK_NONE = 0
ACK_APPLIED = 1
ACK_DEFERRED = 2
ACK_NAMES = {ACK_NONE: None, ACK_APPLIED: "applied", ACK_DEFERRED: "deferred"}
ACK_CODES = {"applied": ACK_APPLIED, "deferred": ACK_DEFERRED}

# Where the GPU figures (C, H, U, A) in the header come from.
FIGURES_NONE = 0
FIGURES_PROVISIONAL = 1
"""Given by engines before any controller published (their measured capacity and policy headroom)."""
FIGURES_PUBLISHED = 2
"""Published by the controller."""

# Owners of a pool in the reservation record.
OWNER_CODES = {"runtime": 0, "elastic": 1}
OWNER_NAMES = {v: k for k, v in OWNER_CODES.items()}

# Byte offsets used as lock ranges (OFD locks; they need not lie inside the file).
LOCK_WRITE = 0
"""The segment's write lock: every change of the segment is made while holding it."""
LOCK_SLOT_BASE = 1
"""Slot i is held by its live owner with a lock on byte ``LOCK_SLOT_BASE + i``."""

CRC_FORMAT = "<Q"
CRC_SIZE = 8


@dataclass(frozen=True)
class RecordSpec:
    """A record's body: field names and their struct codes (little-endian, no implicit padding)."""

    name: str
    fields: tuple[tuple[str, str], ...]

    @property
    def body_format(self) -> str:
        return "<" + "".join(code for _, code in self.fields)

    @property
    def body_size(self) -> int:
        return struct.calcsize(self.body_format)

    @property
    def copy_size(self) -> int:
        """A copy: the body, then its CRC-32 as an 8-byte word, padded to 8 bytes."""
        return _align8(self.body_size) + CRC_SIZE

    @property
    def size(self) -> int:
        """The sequence word and two copies."""
        return 8 + 2 * self.copy_size

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, code in self.fields if not code.endswith("x"))


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _pools_fields() -> tuple[tuple[str, str], ...]:
    fields: list[tuple[str, str]] = []
    for i in range(MAX_POOLS):
        fields += [
            (f"pool{i}_name", f"{POOL_NAME_WIDTH}s"),
            (f"pool{i}_owner", "B"),
            (f"pool{i}_pad", "7x"),
            (f"pool{i}_bytes", "Q"),
            (f"pool{i}_tensor_bytes", "Q"),
        ]
    for i in range(MAX_PARTS):
        fields += [
            (f"part{i}_pool", "I"),
            (f"part{i}_pad", "4x"),
            (f"part{i}_name", f"{PART_NAME_WIDTH}s"),
            (f"part{i}_bytes", "Q"),
        ]
    return tuple(fields)


GPU_RECORD = RecordSpec(
    "gpu",
    (
        ("source", "I"),  # FIGURES_NONE | FIGURES_PROVISIONAL | FIGURES_PUBLISHED
        ("pad", "4x"),
        ("revision", "Q"),  # revision of the last publish (0: none)
        ("capacity", "Q"),  # C
        ("headroom", "Q"),  # H
        ("other_used", "Q"),  # U
        ("elastic_budget", "Q"),  # A as published (NONE_U64 when provisional)
        ("published_at_ns", "Q"),
        ("controller_pid", "Q"),
        ("controller_start", "Q"),
    ),
)

TOTALS_RECORD = RecordSpec(
    "totals",
    (
        ("runtime_reserved", "Q"),  # Σ R_i: static admissions + reported runtime-owned pools
        ("elastic_mapped", "Q"),  # Σ mapped_i over elastic instances
        ("elastic_pending", "Q"),  # Σ pending_i (admitted, not yet committed or rolled back)
        ("guarantees", "Q"),  # Σ g_i over elastic instances
        ("active", "Q"),  # active slots
        ("unmet_guarantees", "Q"),  # Σ max(0, g_i − mapped_i − pending_i) over elastic instances
    ),
)

IDENTITY_RECORD = RecordSpec(
    "identity",
    (
        ("state", "I"),  # SLOT_FREE | SLOT_ACTIVE
        ("flags", "I"),  # FLAG_ELASTIC
        ("epoch", "Q"),  # bumped at every claim and free of the slot
        ("pid", "Q"),
        ("start_time", "Q"),  # /proc/<pid>/stat field 22, clock ticks after boot
        ("pidns", "Q"),  # inode of the owner's pid namespace (0: unknown)
        ("uid", "I"),
        ("rank", "I"),
        ("attached_at_ns", "Q"),
        ("id", f"{ID_WIDTH}s"),
        ("model", f"{MODEL_WIDTH}s"),
        ("engine", f"{ENGINE_WIDTH}s"),
        ("engine_id", f"{ENGINE_ID_WIDTH}s"),  # empty: the instance's own id
    ),
)

PUBLISHED_RECORD = RecordSpec(
    "published",
    (
        ("epoch", "Q"),
        ("revision", "Q"),  # 0 until the controller publishes for this instance
        ("limit", "Q"),
        ("target", "Q"),
        ("guarantee", "Q"),
        ("published_at_ns", "Q"),
    ),
)

USAGE_RECORD = RecordSpec(
    "usage",
    (
        ("epoch", "Q"),
        ("used", "Q"),  # bytes in live blocks of the elastic pool
        ("mapped", "Q"),  # committed bytes of the elastic pool
        ("pending", "Q"),  # admitted bytes not yet committed or rolled back
        ("ack_revision", "Q"),
        ("ack_status", "I"),  # ACK_NONE | ACK_APPLIED | ACK_DEFERRED
        # MiB (rounded up) the elastic pool was refused in its last period: what its waiting work needs.
        # Layout 3's padding word: a writer from before stores 0 there (nothing waits).
        ("waiting_mib", "I"),
        ("deferred_since_ns", "Q"),  # when the current deferral began (0: not deferred)
        ("updated_at_ns", "Q"),
    ),
)

RESERVATION_RECORD = RecordSpec(
    "reservation",
    (
        ("epoch", "Q"),
        ("static_admitted", "Q"),  # admitted by admit_static until report_pools replaces it
        ("reserve", "Q"),  # the model's reserve the admission was checked against (NONE_U64: none)
        ("pool_count", "I"),
        ("part_count", "I"),
        *_pools_fields(),
    ),
)


# --- header -------------------------------------------------------------------------------------

HEADER_STATIC_FORMAT = f"<8sIIIIQ{GPU_ID_WIDTH}sQI"
"""magic, layout_version, header_size, slot_count, slot_size, total_size, gpu_id, created_at_ns, creator_uid."""
HEADER_STATIC_SIZE = struct.calcsize(HEADER_STATIC_FORMAT)  # 108
HEADER_CRC_OFFSET = HEADER_STATIC_SIZE  # u32 CRC-32 of bytes [0, 108)
OFF_GPU_ID = 32
OFF_CREATED_AT = OFF_GPU_ID + GPU_ID_WIDTH
OFF_CREATOR_UID = OFF_CREATED_AT + 8
OFF_GENERATION = 128
OFF_HEARTBEAT = 136
OFF_DIRTY = 144
OFF_PRESSURE = 152
"""+1 at every elastic admission the GPU's budget refused (under the write lock; read as one word).
Added to layout 1 in reserved, zero-filled bytes: a segment from before reads 0 (no pressure)."""
OFF_GPU_RECORD = 192
OFF_TOTALS_RECORD = OFF_GPU_RECORD + GPU_RECORD.size

# --- slot (offsets relative to the slot's start) ---------------------------------------------------

SLOT_OFF_IDENTITY = 0
SLOT_OFF_PUBLISHED = SLOT_OFF_IDENTITY + IDENTITY_RECORD.size
SLOT_OFF_USAGE = SLOT_OFF_PUBLISHED + PUBLISHED_RECORD.size
SLOT_OFF_ACTIVITY = SLOT_OFF_USAGE + USAGE_RECORD.size
SLOT_OFF_RESERVATION = SLOT_OFF_ACTIVITY + 8
SLOT_END = SLOT_OFF_RESERVATION + RESERVATION_RECORD.size

assert (struct.calcsize("<8sIIIIQ"), struct.calcsize(f"<8sIIIIQ{GPU_ID_WIDTH}s")) == (OFF_GPU_ID, OFF_CREATED_AT)
assert HEADER_CRC_OFFSET + 4 <= OFF_GENERATION, "the static header runs into the generation word"
assert OFF_TOTALS_RECORD + TOTALS_RECORD.size <= HEADER_SIZE, "header records overflow the header"
assert SLOT_END <= SLOT_SIZE, f"slot records take {SLOT_END} bytes, more than SLOT_SIZE={SLOT_SIZE}"
assert all(off % 8 == 0 for off in (SLOT_OFF_PUBLISHED, SLOT_OFF_USAGE, SLOT_OFF_ACTIVITY, SLOT_OFF_RESERVATION))


def segment_size(slot_count: int) -> int:
    return HEADER_SIZE + slot_count * SLOT_SIZE


def slot_offset(index: int) -> int:
    return HEADER_SIZE + index * SLOT_SIZE


def layout_table() -> str:
    """The layout as a Markdown table (offset, size, field, meaning): docs/ledger.md carries it."""
    rows = [
        ("header", 0, 8, "magic", f"`{MAGIC.decode()}`"),
        ("header", 8, 4, "layout_version", f"u32, {LAYOUT_VERSION}"),
        ("header", 12, 4, "header_size", f"u32, {HEADER_SIZE}"),
        ("header", 16, 4, "slot_count", f"u32, default {DEFAULT_SLOTS}"),
        ("header", 20, 4, "slot_size", f"u32, {SLOT_SIZE}"),
        ("header", 24, 8, "total_size", "u64, header_size + slot_count × slot_size"),
        ("header", OFF_GPU_ID, GPU_ID_WIDTH, "gpu_id",
         "UTF-8, NUL padded: the GPU's UUID (or a fallback `cuda:N`); equals the file name without `.ledger`"),
        ("header", OFF_CREATED_AT, 8, "created_at_ns", "u64, wall clock"),
        ("header", OFF_CREATOR_UID, 4, "creator_uid", "u32"),
        ("header", HEADER_CRC_OFFSET, 4, "header_crc", f"u32, CRC-32 of bytes 0–{HEADER_STATIC_SIZE - 1}"),
        ("header", OFF_GENERATION, 8, "generation", "u64, +1 at every change an engine makes"),
        ("header", OFF_HEARTBEAT, 8, "heartbeat_ns", "u64, the controller's last heartbeat (0: never)"),
        ("header", OFF_DIRTY, 8, "dirty", "u64, pid of the writer inside a change (0: none); found set, the next writer repairs"),
        ("header", OFF_PRESSURE, 8, "pressure", "u64, +1 at every elastic admission the GPU's budget refused"),
        ("header", OFF_GPU_RECORD, GPU_RECORD.size, "gpu record", _fields(GPU_RECORD)),
        ("header", OFF_TOTALS_RECORD, TOTALS_RECORD.size, "totals record", _fields(TOTALS_RECORD)),
        ("slot", SLOT_OFF_IDENTITY, IDENTITY_RECORD.size, "identity record", _fields(IDENTITY_RECORD)),
        ("slot", SLOT_OFF_PUBLISHED, PUBLISHED_RECORD.size, "published record", _fields(PUBLISHED_RECORD)),
        ("slot", SLOT_OFF_USAGE, USAGE_RECORD.size, "usage record", _fields(USAGE_RECORD)),
        ("slot", SLOT_OFF_ACTIVITY, 8, "last_activity_ns", "u64, one word, stored without the lock"),
        (
            "slot",
            SLOT_OFF_RESERVATION,
            RESERVATION_RECORD.size,
            "reservation record",
            (
                f"epoch, static_admitted, reserve, pool_count, part_count, {MAX_POOLS} × pool "
                f"(name {POOL_NAME_WIDTH}s, owner u8, bytes, tensor_bytes), {MAX_PARTS} × part "
                f"(pool u32, name {PART_NAME_WIDTH}s, bytes)"
            ),
        ),
    ]
    lines = ["| area | offset | size | field | contents |", "| --- | ---: | ---: | --- | --- |"]
    lines += [f"| {a} | {off} | {size} | {name} | {what} |" for a, off, size, name, what in rows]
    return "\n".join(lines)


def _fields(spec: RecordSpec) -> str:
    return (
        f"seq u64, then 2 copies of {spec.copy_size} B: "
        + ", ".join(n for n in spec.names)
        + ", crc"
    )
