"""A command whose optional extra is not installed says which to install, in one line, and exits 2.

The base install (lark, pydantic, regex) runs lint, fmt, explain, test and plan; ``kvpolicy run``
needs ``kvpolicy[runtime]``. Here the extra's modules are hidden from a fresh interpreter
by an import hook that refuses them, as in an environment where they were never installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "two-models.kvp"

HIDING = """
import sys
hidden = set(sys.argv[1].split(",")) - {""}

class NotInstalled:  # a finder that answers for the hidden modules: not there
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from kvpolicy.cli import main
sys.exit(main(sys.argv[2:]))
"""


def kvpolicy(hidden: tuple[str, ...], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDING, ",".join(hidden), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


@pytest.mark.parametrize(("hidden", "named"), [
    (("watchdog",), "watchdog"),
    (("prometheus_client", "pynvml"), "prometheus-client, nvidia-ml-py"),
])
def test_run_without_the_runtime_extra_names_it(tmp_path: Path, hidden: tuple[str, ...], named: str) -> None:
    done = kvpolicy(hidden, "run", str(POLICY), "--once", "--gpu-capacity", "80GiB", "--ledger-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"kvpolicy run: needs the runtime extra ({named} not installed); "
        "install it with: pip install 'kvpolicy[runtime]'\n"
    )


def test_run_with_the_runtime_extra_goes_on(tmp_path: Path) -> None:
    done = kvpolicy((), "run", str(POLICY), "--once", "--gpu-capacity", "80GiB", "--ledger-dir", str(tmp_path / "l"))
    assert done.returncode == 0, done.stderr


BASE_COMMANDS = {
    "lint": ["lint", str(POLICY)],
    "fmt": ["fmt", "--check", str(POLICY)],
    "explain": ["explain", str(POLICY), "--facts", str(ROOT / "policies" / "two-models.facts.json")],
    "plan-vllm": ["plan", "--engine", "vllm", "--model-config", str(ROOT / "tests/vllm/configs/qwen3-8b/config.json"),
                  "--budget", "8GiB", "--max-model-len", "4096"],
    "plan-sglang": ["plan", "--engine", "sglang", "--model-config",
                    str(ROOT / "policies/models/deepseek-v4-flash.json"), "--budget", "40GiB"],
}


NOT_INSTALLED = ("watchdog", "prometheus_client", "pynvml", "cuda", "torch")


@pytest.mark.parametrize("args", BASE_COMMANDS.values(), ids=BASE_COMMANDS.keys())
def test_the_base_commands_need_no_extra(args: list[str]) -> None:
    done = kvpolicy(NOT_INSTALLED, *args)
    assert done.returncode == 0, done.stderr


def test_policy_tests_need_no_extra(tmp_path: Path) -> None:
    for name in ("two-models.kvp", "two-models.facts.json"):
        shutil.copy(ROOT / "policies" / name, tmp_path)
    case = {"name": "runs", "facts": "two-models.facts.json", "expect": {"instances": {}}}
    (tmp_path / "two-models.kvtest.json").write_text(json.dumps({"policy": "two-models.kvp", "cases": [case]}))
    done = kvpolicy(NOT_INSTALLED, "test", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "1 passed, 0 failed" in done.stdout
