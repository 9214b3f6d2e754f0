"""Helpers the commands share: finding policy files, reading option values."""

from __future__ import annotations

import argparse
import re
from fractions import Fraction
from pathlib import Path

from kvpolicy.policy.suggest import did_you_mean
from kvpolicy.units import SIZE_UNITS

POLICY_SUFFIX = ".kvp"


class UsageError(Exception):
    """A command-line mistake: the command prints it and exits 2."""


def policy_files(paths: list[str]) -> list[Path]:
    """The files named, with directories expanded to the ``.kvp`` files under them."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob(f"*{POLICY_SUFFIX}") if p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{name}: no such file or directory")
    return found


def parse_size(text: str) -> int:
    """``141GiB``, ``141 GiB``, ``1.5TiB`` or plain bytes → bytes; argparse type for size options."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 141GiB")
    number, unit = match.groups()
    if not unit:
        if "." in number:
            raise argparse.ArgumentTypeError(f"{text!r}: a size without a unit is a whole number of bytes")
        return int(number)
    if unit not in SIZE_UNITS:
        hint = did_you_mean(unit, SIZE_UNITS)
        raise argparse.ArgumentTypeError(f"unknown unit {unit!r}" + (f"; {hint}" if hint else ""))
    return int(Fraction(number) * SIZE_UNITS[unit])
