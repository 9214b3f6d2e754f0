"""The adapters' ledger protocols (SGLang DeepSeek-V4, vLLM) over the real ledger."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.adapters.sglang_dsv4.ports import InstanceIdentity as SglangIdentity
from kvpolicy.adapters.sglang_dsv4.ports import default_connector

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime import engines, ledger
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.ledger import GpuLedger, GpuLimits
from kvpolicy.units import GiB


@dataclass(frozen=True)
class VllmKey:  # the shape of adapters/vllm_adapter/identity.py InstanceKey
    engine_id: str
    model: str
    rank: int = 0

    @property
    def id(self) -> str:
        return f"{self.engine_id}/{self.rank}"


def publish_gpu(ledger_dir: Path, capacity: int) -> None:
    with LedgerDir(ledger_dir, create=True) as ld:
        ld.gpu("cuda:0", create=True)
        ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(capacity, 0, 0, capacity)}, {})


def test_adapters_find_their_glue_in_kvpolicy_runtime_ledger() -> None:
    from kvpolicy.runtime.ledger import connect_vllm_ledger

    assert ledger.attach_static is engines.attach_static
    assert connect_vllm_ledger is engines.connect_vllm_ledger


def test_sglang_session_admits_and_reports(ledger_dir: Path) -> None:
    publish_gpu(ledger_dir, 100 * GiB)
    # the DeepSeek-V4 adapter's own connector and identity, as its hooks use them
    connect = default_connector(AdapterEnv(enabled=True, policy=None, model=None, ledger_dir=ledger_dir))
    session = connect(SglangIdentity("deepseek-v4-flash", "cuda:0", 0))
    try:
        assert session.admit(40 * GiB) == 40 * GiB
        session.report_pools({"swa": PoolFacts(bytes=10 * GiB), "c4": PoolFacts(bytes=20 * GiB)})
        led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
        assert led.totals().runtime_reserved == 30 * GiB
        other = connect(SglangIdentity("deepseek-v4-flash", "cuda:0", 1))
        with pytest.raises(AdapterError, match="cannot admit 80 GiB .* unreserved = C − H − U − R − G"):
            other.admit(80 * GiB)
        other.instance.detach()
    finally:
        session.instance.detach()


def test_vllm_client_admits_per_instance_and_releases(ledger_dir: Path) -> None:
    publish_gpu(ledger_dir, 50 * GiB)
    client = ledger.connect_vllm_ledger(AdapterEnv(enabled=True, policy=None, model=None, ledger_dir=ledger_dir))
    key = VllmKey("qwen", "qwen3-8b")
    assert client.admit(key, "cuda:0", 20 * GiB) == 20 * GiB
    client.report_pools(key, {"kv": PoolFacts(bytes=19 * GiB)})
    led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
    (view,) = led.slots()[0]
    assert (view.id, view.engine, view.engine_id, view.runtime_reserved) == ("qwen/0", "vllm", "qwen", 19 * GiB)
    with pytest.raises(AdapterError, match="cannot admit"):
        client.admit(VllmKey("other", "qwen3-8b"), "cuda:0", 40 * GiB)
    client.release(key)
    client.release(VllmKey("other", "qwen3-8b"))
    assert led.totals().active == 0


def test_before_a_controller_the_measured_gpu_and_policy_headroom_are_used(
    ledger_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\ndefaults {\n  headroom 2 GiB\n}\ngpu "cuda:0" {\n  capacity 60 GiB\n}\n')
    # measure_gpu stands in for cuMemGetInfo on this CPU-only machine (it runs for real on the GPU)
    monkeypatch.setattr(engines, "measure_gpu", lambda: engines.Measured(capacity=80 * GiB, used=10 * GiB))
    monkeypatch.setenv("KVPOLICY_POLICY", str(policy))
    session = ledger.attach_static(ledger_dir, SglangIdentity("m", "cuda:0", 0))
    try:
        with pytest.raises(AdapterError) as err:
            session.admit(49 * GiB)  # 60 (policy capacity) − 2 (headroom) − 10 (other use) = 48 GiB
        assert "48 GiB" in str(err.value) and "provisional" in str(err.value)
        assert session.admit(48 * GiB) == 48 * GiB
        f = GpuLedger.open(ledger_dir, "cuda:0", create=False).figures()
        assert (f.source, f.capacity, f.headroom, f.other_used) == ("provisional", 60 * GiB, 2 * GiB, 10 * GiB)
    finally:
        session.instance.detach()


def test_policy_gpu_figures_reads_headroom_percent(tmp_path: Path) -> None:
    policy = tmp_path / "p.kvp"
    policy.write_text("version 1\ngpu * {\n  headroom 10%\n}\n")
    assert engines.policy_gpu_figures(policy, "cuda:1", 100 * GiB) == (100 * GiB, 10 * GiB)
    assert engines.policy_gpu_figures(None, "cuda:1", 100 * GiB) == (100 * GiB, 0)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda_available(), reason="checks a machine without a GPU")
def test_measure_gpu_without_a_driver_library_is_none() -> None:
    # cuda-python 13 raises (a RuntimeError) when it cannot load libcuda; measure_gpu says "no figures".
    assert engines.measure_gpu() is None


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and torch")
def test_measure_gpu_on_a_real_device_matches_cuMemGetInfo(ledger_dir: Path) -> None:
    import torch

    torch.cuda.init()
    torch.cuda.set_device(0)
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # something in use
    m = engines.measure_gpu()
    free, total = torch.cuda.mem_get_info()
    assert m is not None and m.capacity == total and abs(m.used - (total - free)) <= 64 << 20
    session = ledger.attach_static(ledger_dir, SglangIdentity("m", "cuda:0", 0))
    try:
        assert session.admit(GiB) == GiB
        f = GpuLedger.open(ledger_dir, "cuda:0", create=False).figures()
        assert f.source == "provisional" and f.capacity == total and f.other_used >= 256 << 20
    finally:
        session.instance.detach()
        del block
