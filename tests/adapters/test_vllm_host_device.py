"""A vLLM rank on the CPU: its device key is the host's memory, and its figures come from the policy or a controller.

Against the real shared-memory ledger and, for the wait, a real controller on a thread.
"""

from __future__ import annotations

import sys

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.ledger_port import HOST_DEVICE
from kvpolicy.adapters.vllm_adapter.identity import InstanceKey, worker_gpu
from kvpolicy.adapters.vllm_adapter.ledger import RankSessions
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.runtime.client import resolve_access
from kvpolicy.runtime.errors import AdmissionRefused
from kvpolicy.runtime.ledger import GpuLedger
from tests.controller.site import Site

MiB = 1 << 20
KEY = InstanceKey(engine_id="cpu-engine", model="chat", rank=0)


def worker(device_type: str | None) -> SimpleNamespace:
    parallel = SimpleNamespace(assigned_physical_gpu_ids=None)
    w = SimpleNamespace(parallel_config=parallel, local_rank=0)
    if device_type is not None:
        w.device = SimpleNamespace(type=device_type)
    return w


def test_a_cpu_worker_keeps_its_kv_cache_in_the_hosts_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: a GPU worker's id falls back to cuda:N
    assert HOST_DEVICE == "cpu:0"
    assert worker_gpu(worker("cpu")) == HOST_DEVICE
    assert worker_gpu(worker("cuda")) == "cuda:3"
    assert worker_gpu(worker(None)) == "cuda:3"


def sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, wait: str) -> RankSessions:
    file = tmp_path / "policy.kvp"
    file.write_text(policy)
    monkeypatch.setenv("KVPOLICY_POLICY", str(file))
    monkeypatch.setenv("KVPOLICY_LEDGER_DIR", str(tmp_path / "ledger"))
    monkeypatch.setenv("KVPOLICY_FIGURES_WAIT", wait)
    return RankSessions(AdapterEnv.from_environ())


def slots(tmp_path: Path) -> list:
    views, problems = GpuLedger.open(tmp_path / "ledger", HOST_DEVICE, resolve_access()).slots()
    assert not problems
    return views


def test_the_policys_capacity_admits_a_cpu_rank_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = sessions(tmp_path, monkeypatch, 'version 1\ngpu "cpu:0" { capacity 256 MiB }\nmodel "chat" { reserve 96 MiB }\n', "0")
    try:
        assert ranks.admit(KEY, HOST_DEVICE, 96 * MiB) == 96 * MiB
        figures = GpuLedger.open(tmp_path / "ledger", HOST_DEVICE, resolve_access()).figures()
        assert (figures.source, figures.capacity) == ("provisional", 256 * MiB)
        # The same capacity refuses what does not fit.
        other = InstanceKey(engine_id="second", model="chat", rank=0)
        with pytest.raises(AdmissionRefused, match=r"cannot admit 192 MiB .* on cpu:0"):
            ranks.admit(other, HOST_DEVICE, 192 * MiB)
    finally:
        ranks.release(KEY)


def test_without_figures_a_cpu_rank_refuses_naming_what_it_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = sessions(tmp_path, monkeypatch, 'version 1\nmodel "chat" { reserve 96 MiB }\n', "0")
    with pytest.raises(AdapterError) as refused:
        ranks.admit(KEY, HOST_DEVICE, 96 * MiB)
    message = str(refused.value)
    assert "waited 0 s for a controller to publish figures for cpu:0" in message
    assert 'gpu "cpu:0" { capacity' in message and "--gpu-capacity" in message and "KVPOLICY_FIGURES_WAIT" in message
    assert slots(tmp_path) == []  # the refused rank left nothing behind


def test_a_cpu_rank_waits_for_the_controllers_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = Site(tmp_path)  # its controller publishes for every device whose ledger exists (StaticSampler 80 GiB)
    ranks = sessions(tmp_path, monkeypatch, site.policy.read_text(), "300")  # 300 s: only a hang reaches it
    # The controller starts once the rank has created the device's ledger and is waiting.
    waiting = threading.Event()
    started: list[object] = []

    def start_controller() -> None:
        waiting.wait(300)
        started.append(site.controller())

    thread = threading.Thread(target=start_controller, daemon=True)
    thread.start()
    original = GpuLedger.figures

    def figures(self: GpuLedger):  # the rank asks for figures: it is waiting now
        waiting.set()
        return original(self)

    monkeypatch.setattr(GpuLedger, "figures", figures)
    try:
        assert ranks.admit(KEY, HOST_DEVICE, 96 * MiB) == 96 * MiB
        thread.join(300)
        assert started, "the controller never started"
        (view,) = slots(tmp_path)
        assert (view.id, view.static_admitted) == (KEY.id, 96 * MiB)
    finally:
        ranks.release(KEY)
        site.close()
