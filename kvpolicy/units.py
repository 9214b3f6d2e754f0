"""Size, percent and duration literals: parsing, exact arithmetic and display.

Everything is exact: sizes are integers of bytes, percentages are Fractions until
they are resolved against a GPU's capacity (rounding down), durations are seconds.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from kvpolicy.suggest import did_you_mean

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

BINARY_UNITS: dict[str, int] = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}
DECIMAL_UNITS: dict[str, int] = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
SIZE_UNITS: dict[str, int] = {**BINARY_UNITS, **DECIMAL_UNITS}
DURATION_UNITS: dict[str, Fraction] = {
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
DECIMAL_TO_BINARY = {"KB": "KiB", "MB": "MiB", "GB": "GiB", "TB": "TiB"}

MAX_SIZE = 1 << 60
"""The largest size a flag, facts or a test file may give: 1 EiB, far beyond any GPU, and
small enough that the figures of a GPU's instances add up within the ledger's 64-bit fields."""
MAX_SIZE_TEXT = "1048576 TiB"

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
SIZE_EXAMPLE = "80 GiB"
_SHORT_UNITS = {"K": "KiB", "M": "MiB", "G": "GiB", "T": "TiB"}
"""``80G`` or ``80Gi`` (as other tools write them) → the binary unit a GPU's memory comes in."""


def parse_number(text: str) -> Fraction:
    """An exact value for a decimal literal such as ``12``, ``-3`` or ``1.25``."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return Fraction(text)


def size_bytes(number: int | Fraction, unit: str) -> int:
    """Bytes for ``number unit`` (floor: a size is a whole number of bytes)."""
    return math.floor(number * SIZE_UNITS[unit])


def parse_size(text: str) -> int:
    """``"40 GiB"``, ``"40GiB"`` or ``"1.5 TiB"`` → bytes (rounded down, as in the language).

    The unit is required, as in a policy: a bare number is refused, so that ``80`` meant
    as gigabytes is never taken for 80 bytes. Raises ValueError saying what to write.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size: write a number and a unit, e.g. {SIZE_EXAMPLE}")
    number, unit = match.groups()
    if not unit:
        raise ValueError(f"{text!r}: a size needs a unit, e.g. {number} GiB (units: {', '.join(SIZE_UNITS)})")
    if unit not in SIZE_UNITS:
        short = _SHORT_UNITS.get(unit.upper().removesuffix("I"))
        hint = f"did you mean {short!r}?" if short else did_you_mean(unit, SIZE_UNITS)
        raise ValueError(f"{text!r}: unknown unit {unit!r}" + (f"; {hint}" if hint else f" (units: {', '.join(SIZE_UNITS)})"))
    whole = number.split(".")[0].lstrip("0")
    if len(whole) > len(str(MAX_SIZE)) or len(number) > 100:  # before arithmetic on a thousand digits
        shown = text if len(text) <= 40 else text[:30] + "..."
        raise ValueError(f"{shown!r} is too large or too long: at most {MAX_SIZE_TEXT}")
    size = size_bytes(Fraction(number), unit)
    if size > MAX_SIZE:
        raise ValueError(f"{text!r} is too large: at most {MAX_SIZE_TEXT}")
    return size


def duration_seconds(number: int | Fraction, unit: str) -> float:
    return float(number * DURATION_UNITS[unit])


def percent_of(percent: Fraction, capacity: int) -> int:
    """``percent`` % of ``capacity`` bytes, rounded down."""
    return math.floor(percent * capacity / 100)


def round_down(value: int, granule: int) -> int:
    """The largest multiple of ``granule`` not above ``value`` (``value`` ≥ 0)."""
    return value - value % granule if granule > 0 else value


def format_bytes(n: int) -> str:
    """A short human form: exact binary units when the value is whole, else 2 decimals.

    >>> format_bytes(40 * GiB), format_bytes(3 * MiB // 2), format_bytes(123)
    ('40 GiB', '1.50 MiB', '123 B')
    """
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = BINARY_UNITS[unit]
        if n >= scale:
            if n % scale == 0:
                return f"{sign}{n // scale} {unit}"
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"


