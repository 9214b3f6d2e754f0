"""Which names in which directories decide what a path reads: its chain of symlinks.

A policy may be a symlink into another directory, or the kubelet's ConfigMap
chain (``policy.kvp`` → ``..data/policy.kvp``, ``..data`` → ``..2026_…``). A
change to any link on the way, or to the file at its end, changes what the path
reads, so the watcher watches the directory of each of them and re-resolves the
chain whenever a link in it is replaced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MAX_LINKS = 40
"""As the kernel: more symlinks than this on one path is a loop (ELOOP)."""


@dataclass(frozen=True)
class Chain:
    links: tuple[str, ...]
    """Every symlink resolving the path goes through, in order, each as ``resolved-dir/name``."""
    target: str
    """The name at the end of the chain (``resolved-dir/name``); it may not exist."""

    @property
    def names(self) -> frozenset[str]:
        """The links and the target: an event on any of them may change what the path reads."""
        return frozenset((*self.links, self.target))

    @property
    def directories(self) -> frozenset[str]:
        """The directories that hold those names: the ones to watch."""
        return frozenset(os.path.dirname(name) for name in self.names)


def resolve_chain(path: Path | str) -> Chain:
    """Resolve ``path`` one component at a time, recording each symlink followed.

    A missing component ends nothing: the rest of the path is appended as written, so
    the chain names where the file would appear. A loop stops after ``MAX_LINKS``.
    """
    pending = list(Path(os.path.join(os.getcwd(), path)).parts[1:])
    here = os.sep
    links: list[str] = []
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            here = os.path.dirname(here)
            continue
        candidate = os.path.join(here, name)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a symlink, or not there (yet)
            here = candidate
            continue
        links.append(candidate)
        if len(links) > MAX_LINKS:
            return Chain(tuple(links), candidate)
        parts = list(Path(target).parts)
        if os.path.isabs(target):
            here, parts = os.sep, parts[1:]
        pending = parts + pending
    return Chain(tuple(links), here)
