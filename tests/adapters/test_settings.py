"""Every ``KVPOLICY_*`` variable the adapters read is parsed once, in kvpolicy.adapters.settings."""

from __future__ import annotations

import ast
from pathlib import Path

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpolicy.adapters import settings
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv, VllmEnv

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"


def test_unset_and_empty_variables_take_the_defaults() -> None:
    for environ in ({}, {name: "" for name in vars(settings) if name.startswith("ENV_")}):
        env = AdapterEnv.from_environ(environ)
        assert (env.enabled, env.policy, env.model, env.engine_id) == (False, None, None, None)
        assert env.ledger_dir == Path("/dev/shm/kvpolicy")
        assert VllmEnv.from_environ(environ) == VllmEnv(report_interval=1.0, give_back_interval=1.0, grow_bytes=16 << 20)


def test_shared_settings() -> None:
    env = AdapterEnv.from_environ({
        "KVPOLICY_ENABLE": " Yes ", "KVPOLICY_POLICY": "/etc/p.kvp", "KVPOLICY_MODEL": "m",
        "KVPOLICY_LEDGER_DIR": "/tmp/l", "KVPOLICY_ENGINE_ID": "eng",
    })
    assert env == AdapterEnv(enabled=True, policy=Path("/etc/p.kvp"), model="m", ledger_dir=Path("/tmp/l"), engine_id="eng")
    assert AdapterEnv.from_environ({"KVPOLICY_ENABLE": "0"}).enabled is False
    with pytest.raises(AdapterError, match=r"KVPOLICY_ENABLE='on': expected 1 or 0"):
        AdapterEnv.from_environ({"KVPOLICY_ENABLE": "on"})


@pytest.mark.parametrize("name", ["KVPOLICY_REPORT_INTERVAL", "KVPOLICY_ELASTIC_GIVE_BACK_INTERVAL",
                                  "KVPOLICY_ELASTIC_YIELD_ABOVE_TARGET"])
@pytest.mark.parametrize("text", ["-1", "-0.5", "nan", "inf", "soon", "1s"])
def test_intervals_are_finite_seconds_not_below_zero(name: str, text: str) -> None:
    with pytest.raises(AdapterError, match=rf"{name}='{text}': expected seconds >= 0"):
        VllmEnv.from_environ({name: text})


@hypothesis.settings(deadline=None)  # a loaded machine may stall any example: no time limit
@given(st.floats(min_value=0, allow_infinity=False, allow_nan=False))
def test_any_finite_interval_reads_back(seconds: float) -> None:
    env = VllmEnv.from_environ({"KVPOLICY_REPORT_INTERVAL": f" {seconds!r} ",
                                "KVPOLICY_ELASTIC_GIVE_BACK_INTERVAL": repr(seconds),
                                "KVPOLICY_ELASTIC_YIELD_ABOVE_TARGET": repr(seconds)})
    assert env.report_interval == env.give_back_interval == env.yield_above_target == seconds


@pytest.mark.parametrize("text", ["-1", "1.5", "1e6", "many", "²"])
def test_the_give_back_bound_is_a_whole_number_of_chunks_128_unless_set_0_for_none(text: str) -> None:
    """Both adapters read it (their elastic pools' give-back), once enabled: a disabled engine ignores it."""
    on = {"KVPOLICY_ENABLE": "1"}
    expected = r"KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS=.*expected a whole number, e.g. 128 \(0: no bound\)"
    with pytest.raises(AdapterError, match=expected):
        AdapterEnv.from_environ({**on, "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": text})
    assert AdapterEnv.from_environ({"KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": text}).give_back_chunks == 128  # not read
    assert AdapterEnv.from_environ(on).give_back_chunks == 128
    assert AdapterEnv.from_environ({**on, "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": " "}).give_back_chunks == 128
    assert AdapterEnv.from_environ({**on, "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": " 32 "}).give_back_chunks == 32
    assert AdapterEnv.from_environ({**on, "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS": "0"}).give_back_chunks is None


@pytest.mark.parametrize("text", ["-1", "1.5", "1e6", "16MiB", "²"])
def test_grow_bytes_is_a_whole_number(text: str) -> None:
    with pytest.raises(AdapterError, match=r"KVPOLICY_ELASTIC_GROW_BYTES=.*expected a whole number of bytes"):
        VllmEnv.from_environ({"KVPOLICY_ELASTIC_GROW_BYTES": text})
    assert VllmEnv.from_environ({"KVPOLICY_ELASTIC_GROW_BYTES": "0"}).grow_bytes == 0
    assert VllmEnv.from_environ({"KVPOLICY_ELASTIC_GROW_BYTES": "33554432"}).grow_bytes == 32 << 20


def test_the_report_interval_is_one_setting_for_both_of_its_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine core's live report and the elastic pool's report read the same parse: a value one of
    them refused and the other took (-1 was accepted by the first, refused by the second) is refused."""
    from kvpolicy.adapters.vllm_adapter.reports import EngineReporter

    monkeypatch.setenv("KVPOLICY_REPORT_INTERVAL", "0.25")
    assert EngineReporter.from_environ().interval == VllmEnv.from_environ().report_interval == 0.25
    monkeypatch.setenv("KVPOLICY_REPORT_INTERVAL", "-1")
    with pytest.raises(AdapterError, match="KVPOLICY_REPORT_INTERVAL='-1'"):
        EngineReporter.from_environ()


def test_the_ledger_directory_is_the_ledgers_own_setting() -> None:
    from kvpolicy.runtime import client

    assert (settings.ENV_LEDGER_DIR, settings.DEFAULT_LEDGER_DIR) == (client.ENV_LEDGER_DIR, client.DEFAULT_LEDGER_DIR)


def _kvpolicy_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of each lookup that may read a KVPOLICY_ variable: on the environment (``os.environ``,
    ``os.getenv``, a mapping named ``environ``) any key but a literal other name; on any mapping a key
    that names one (``ENV_*``, ``"KVPOLICY_*"``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner, key = ast.unparse(node.func.value), node.args[0]
            if not (node.func.attr in ("get", "pop", "setdefault") or (owner == "os" and node.func.attr == "getenv")):
                continue
        elif isinstance(node, ast.Subscript):
            owner, key = ast.unparse(node.value), node.slice
        else:
            continue
        text = ast.unparse(key)
        on_environ = "environ" in owner or owner == "os"
        literal_other = isinstance(key, ast.Constant) and not str(key.value).startswith("KVPOLICY_")
        if (on_environ and not literal_other) or text.startswith("ENV_") or "KVPOLICY_" in text:
            found.append((node.lineno, text))
    return found


def kvpolicy_reads_outside_settings(root: Path) -> dict[str, list[str]]:
    reads = {}
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root))
        found = _kvpolicy_reads(ast.parse(path.read_text(), name))
        if found and name != "settings.py":
            reads[name] = [key for _, key in found]
    return reads


def test_no_adapter_module_but_settings_reads_a_kvpolicy_variable() -> None:
    # The one lookup left is the plugin's write: the engine id its child processes inherit.
    assert kvpolicy_reads_outside_settings(ADAPTERS) == {"vllm_adapter/plugin.py": ["ENV_ENGINE_ID"]}
