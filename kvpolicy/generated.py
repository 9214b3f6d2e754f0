"""Files generated from the code, each by one command: ``python -m MODULE`` writes them,
``--check`` exits 1 when one is stale and writes nothing (the tests run the check).

The lint-rule reference (``kvpolicy.lint.docs``), the language server's hover table
(``kvpolicy.lsp.reference``) and the published JSON Schemas (``kvpolicy.evaluate.schemas``)
are made this way; each module says what its files are and renders them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
"""The checkout's root: generated files are written into the repository, not an installed copy."""


def main(module: str, doc: str | None, render: Callable[[], dict[Path, str]], argv: Sequence[str] | None) -> int:
    """The generator command of ``module``: ``render()`` gives each file's path and its text.
    ``--into DIR`` writes (or checks) the files of those names under DIR instead."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale; write nothing")
    parser.add_argument("--into", type=Path, metavar="DIR", help="the files under DIR, by their names (default: where they live)")
    args = parser.parse_args(argv)
    files = {(args.into / path.name if args.into else path): text for path, text in render().items()}
    stale = {path: text for path, text in files.items() if _current(path) != text}
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python -m {module}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in stale.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _current(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None
