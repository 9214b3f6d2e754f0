"""The GPU runner's own set-up, checked where CI runs: its steps import the kvpolicy that
scripts/gpu-check installs (the wheel's layout, grammar and adapters inside), not the checkout's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.alloc.gpu_suite import ROOT, step_environment


def test_the_steps_import_the_installed_kvpolicy_before_the_checkouts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(ROOT / "kvpolicy", site / "kvpolicy")
    shutil.copytree(ROOT / "grammar", site / "kvpolicy" / "grammar")  # laid out as the wheel lays it out
    env = step_environment({"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    probe = "import kvpolicy, tests; print(kvpolicy.__file__); print(tests.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.split()
    assert Path(out[0]).is_relative_to(site), out  # the installed one, with kvpolicy.grammar in it
    assert Path(out[1]).is_relative_to(ROOT / "tests"), out  # the root still serves the tests package
