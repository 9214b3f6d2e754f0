"""Just enough of Dockerfile syntax to read the project's own Dockerfiles in tests:
instructions with their continuation lines joined, comment lines dropped, split into stages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper-case: FROM, RUN, COPY, …"""
    args: str
    """The rest of the instruction, continuation lines joined (Docker drops each backslash-newline)."""
    line: int


def instructions(path: Path) -> list[Instruction]:
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment inside a continued instruction is dropped by Docker too
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].rstrip())
            continue
        pending.append(stripped)
        keyword, _, first = pending[0].partition(" ")
        found.append(Instruction(keyword.upper(), " ".join([first.strip(), *pending[1:]]).strip(), start))
        pending = []
    return found


def stages(path: Path) -> list[list[Instruction]]:
    """The instructions of each build stage (from its FROM); instructions before the first FROM are left out."""
    out: list[list[Instruction]] = []
    for ins in instructions(path):
        if ins.keyword == "FROM":
            out.append([ins])
        elif out:
            out[-1].append(ins)
    return out


def args_defaults(path: Path) -> dict[str, str]:
    """Every ``ARG NAME=default`` of the file, wherever it stands."""
    found = {}
    for ins in instructions(path):
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            found[name.strip()] = value.strip()
    return found
