"""Mutated policies: the example policies and golden files broken by byte and token edits.

Mutant ``i`` depends only on the seed and ``i`` (``random.Random(f"{seed}/{i}")``), so a
failure names a mutant that ``mutant(bases, seed, i)`` rebuilds exactly.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_GLOBS = ("policies/*.kvp", "tests/golden/lint/*.kvp", "tests/golden/fmt/*.kvp")

_TOKEN = re.compile(rb'"(?:[^"\\\n]|\\.)*"|#[^\n]*|\d+(?:\.\d+)?|[A-Za-z_][\w.]*|[ \t]+|\n|.', re.S)

WORDS = [
    b"{", b"}", b"(", b")", b";", b",", b"*", b'"', b"#", b"\n", b"<", b"==", b"-", b".", b"0", b"1e9",
    b"GiB", b"GB", b"%", b"s", b"model", b"rule", b"when", b"to", b"and", b"not", b"version", b"pool",
    b"max", b"min", b"gpu.free", b"model.idle", b"\\", b"\t", b"\r", b"\x1b[31m", b"\x00", b"\xe2\x80\xae",
]
SUPPRESSIONS = [
    b"# kvpolicy: ignore[KV019] on purpose", b"# kvpolicy: ignore[KV017] tested", b"# kvpolicy: ignore[KV020]",
    b"# kvpolicy: ignore[KV019, KV022] both", b"# kvpolicy: ignore[KV999] no such", b"# kvpolicy: ignore[KV001] x",
]
NOT_UTF8 = [b"\xff", b"\xc3", b"\xe9", b"\x80\x80", b"\xed\xa0\x80"]


def bases() -> list[bytes]:
    found = sorted({p for pattern in BASE_GLOBS for p in ROOT.glob(pattern)})
    return [p.read_bytes() for p in found]


def mutant(base_texts: list[bytes], seed: int, index: int) -> bytes:
    rng = random.Random(f"{seed}/{index}")
    data = rng.choice(base_texts)
    for _ in range(rng.randint(1, 4)):
        data = _mutate(data, rng)
    return data


def _mutate(data: bytes, rng: random.Random) -> bytes:
    parts = _TOKEN.findall(data) or [b""]
    i = rng.randrange(len(parts))
    how = rng.choice([
        "delete", "delete", "duplicate", "swap", "replace", "replace", "insert_word", "suppress", "suppress",
        "truncate", "byte_flip", "byte_insert", "byte_delete", "not_utf8", "nest", "huge", "join_lines",
    ])
    if how == "delete":
        del parts[i]
    elif how == "duplicate":
        parts.insert(i, parts[i])
    elif how == "swap" and i + 1 < len(parts):
        parts[i], parts[i + 1] = parts[i + 1], parts[i]
    elif how == "replace":
        parts[i] = rng.choice(WORDS)
    elif how == "insert_word":
        parts.insert(i, rng.choice(WORDS) + rng.choice([b"", b" "]))
    elif how == "suppress":  # after code on a line, after a ';', or alone on a line
        ends = [k for k, p in enumerate(parts) if p in (b"\n", b";")] or [len(parts) - 1]
        k = rng.choice(ends)
        comment = rng.choice(SUPPRESSIONS)
        if parts[k] == b";":
            parts.insert(k + 1, comment + b"\n")
        elif rng.random() < 0.5:
            parts.insert(k, rng.choice([b"  ", b" ", b""]) + comment)
        else:
            parts.insert(k + 1, comment + b"\n")
    elif how == "truncate":
        return data[: rng.randrange(len(data) + 1)]
    elif how == "byte_flip" and data:
        at = rng.randrange(len(data))
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    elif how == "byte_insert":
        at = rng.randrange(len(data) + 1)
        return data[:at] + bytes([rng.randrange(256)]) + data[at:]
    elif how == "byte_delete" and data:
        at = rng.randrange(len(data))
        return data[:at] + data[at + 1 :]
    elif how == "not_utf8":
        at = rng.randrange(len(data) + 1)
        return data[:at] + rng.choice(NOT_UTF8) + data[at:]
    elif how == "nest":
        depth = rng.randint(10, 200)
        opener, closer = rng.choice([(b"(", b")"), (b"{", b"}"), (b"not ", b""), (b"pool x {", b"}"), (b'model "m" {', b"}")])
        parts.insert(i, opener * depth + rng.choice([b"", b"gpu.free < 1 GiB"]) + closer * rng.randint(0, depth))
    elif how == "huge":
        parts.insert(i, rng.choice([b"9" * 40, b"1" + b"0" * 400, b"0." + b"0" * 50 + b"1", b"-" + b"9" * 25])
                     + rng.choice([b"", b" GiB", b"%", b"s", b" TiB"]))
    elif how == "join_lines":
        parts = [b";" if p == b"\n" and rng.random() < 0.5 else p for p in parts]
    return b"".join(parts)
