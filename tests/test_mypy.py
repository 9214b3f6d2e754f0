"""The project passes its own type check: ``python -m mypy`` from the repository root.

The configuration is ``[tool.mypy]`` in ``pyproject.toml``: ``kvpolicy`` and
``kvpolicy.adapters`` (the ``adapters/`` folder, seen through ``.typecheck/`` so that every
adapter module has that one name), the engines and GPU bindings declared untyped. mypy runs
in a subprocess with its incremental cache in ``.mypy_cache`` (a second run rechecks only
what changed). The second test shows the check can fail: the same configuration, on a
module with planted errors, must report each of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def test_the_project_passes_mypy() -> None:
    run = _mypy()
    assert run.returncode == 0, f"mypy found errors (python -m mypy from {ROOT}):\n{run.stdout}{run.stderr}"
    assert "Success: no issues found" in run.stdout


def test_the_adapters_are_checked_as_kvpolicy_adapters() -> None:
    link = ROOT / ".typecheck" / "kvpolicy" / "adapters"
    assert link.is_symlink() and link.resolve() == ROOT / "adapters"


PLANTED = '''\
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.units import size_bytes


def untyped(x):
    return x


def wrong_argument() -> int:
    return size_bytes("1", "GiB")


def no_such_attribute(env: AdapterEnv) -> object:
    return env.no_such_setting
'''


def test_a_type_error_fails_the_check(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    # its own last line: mypy's cache keeps a module's errors by its text, with the path of the
    # run that wrote them, so the same text at another temporary path would be reported there
    planted.write_text(f"{PLANTED}# {tmp_path}\n", encoding="utf-8")
    run = _mypy(str(planted))
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    # one error per planted mistake: an unannotated function (the configuration's strictness),
    # a wrong argument to kvpolicy, a missing attribute of an adapter class (so kvpolicy.adapters
    # was found and read, not taken as an unknown module)
    assert f"{planted}:5: error: Function is missing a type annotation  [no-untyped-def]" in output
    assert f"{planted}:10: error: " in output and "[arg-type]" in output
    assert f'{planted}:14: error: "AdapterEnv" has no attribute "no_such_setting"  [attr-defined]' in output
    assert "Found 3 errors in 1 file" in output
    assert "import-not-found" not in output and "import-untyped" not in output
