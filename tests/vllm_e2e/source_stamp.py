"""A digest of the kvpolicy sources a wheel is built from, to tell a stale e2e venv from a fresh one.

scripts/vllm-e2e-env installs kvpolicy into the end-to-end venv as users do (a built
wheel, not editable), so that copy does not follow later edits of the worktree. The
script records this digest beside the install; the tests compare it with the
worktree's and refuse to run on a copy built from other sources.

Run as a script, it prints the digest of the repository it lives in.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the wheel is built from: pyproject.toml and the package folders it maps into kvpolicy.
SOURCES = ("pyproject.toml", "kvpolicy", "adapters", "grammar")
STAMP_NAME = "kvpolicy-source.sha256"


def source_digest(repo: Path = REPO) -> str:
    """sha256 over the relative path and bytes of every source file (sorted; caches skipped)."""
    digest = hashlib.sha256()
    for top in SOURCES:
        root = repo / top
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(repo).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


if __name__ == "__main__":
    sys.stdout.write(source_digest() + "\n")
