"""The engines' port to the ledger (``EngineSession``) and the adapters' sessions, over the real ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvpolicy.adapters import ledger_port
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.ledger_port import as_startup_failure, gpu_capacity, open_session
from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.adapters.sglang_dsv4.ports import InstanceIdentity as SglangIdentity
from kvpolicy.adapters.sglang_dsv4.ports import default_connector
from kvpolicy.adapters.vllm_adapter.identity import InstanceKey
from kvpolicy.adapters.vllm_adapter.ledger import RankSessions, ledger_identity

from kvpolicy.facts import PoolFacts
from kvpolicy.runtime import ledger
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.errors import AdmissionRefused, Detached, LedgerError
from kvpolicy.runtime.ledger import GpuLedger, GpuLimits
from kvpolicy.runtime.session import EngineIdentity, EngineSession, MeasuredGpu, ledger_capacity
from kvpolicy.units import GiB


def publish_gpu(ledger_dir: Path, capacity: int) -> None:
    with LedgerDir(ledger_dir, create=True) as ld:
        ld.gpu("cuda:0", create=True)
        ld.publish(ld.read(), 1, {"cuda:0": GpuLimits(capacity, 0, 0, capacity)}, {})


def env_for(ledger_dir: Path, policy: Path | None = None) -> AdapterEnv:
    return AdapterEnv(enabled=True, policy=policy, model=None, ledger_dir=ledger_dir)


def identity(name: str, rank: int = 0, gpu: str = "cuda:0") -> EngineIdentity:
    return EngineIdentity(instance_id=f"{name}/{rank}", model=name, engine="any", engine_id=name, rank=rank, gpu=gpu)


def test_the_adapters_reach_the_ledger_through_the_runtime_port(ledger_dir: Path) -> None:
    import kvpolicy.runtime as runtime

    assert runtime.EngineSession is EngineSession and runtime.EngineIdentity is EngineIdentity
    with pytest.raises(AttributeError):  # no engine glue re-exported from the ledger's module any more
        ledger.attach_static  # noqa: B018 - the lookup is what must raise
    publish_gpu(ledger_dir, 10 * GiB)
    session = default_connector(env_for(ledger_dir))(SglangIdentity("deepseek-v4-flash", "cuda:0", 0))
    try:
        assert isinstance(session, EngineSession)
        assert session.identity == SglangIdentity("deepseek-v4-flash", "cuda:0", 0).ledger_identity()
        assert session.identity.engine == "sglang"
    finally:
        session.close()
    key = InstanceKey("qwen", "qwen3-8b", rank=1)
    assert ledger_identity(key, "cuda:0") == EngineIdentity(
        instance_id="qwen/1", model="qwen3-8b", engine="vllm", engine_id="qwen", rank=1, gpu="cuda:0"
    )


def test_sglang_session_admits_and_reports(ledger_dir: Path) -> None:
    publish_gpu(ledger_dir, 100 * GiB)
    # the DeepSeek-V4 adapter's own connector and identity, as its hooks use them
    connect = default_connector(env_for(ledger_dir))
    session = connect(SglangIdentity("deepseek-v4-flash", "cuda:0", 0))
    try:
        assert session.admit_static(40 * GiB) == 40 * GiB
        session.report_pools({"swa": PoolFacts(bytes=10 * GiB), "c4": PoolFacts(bytes=20 * GiB)})
        led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
        assert led.totals().runtime_reserved == 30 * GiB
        other = connect(SglangIdentity("deepseek-v4-flash", "cuda:0", 1))
        with pytest.raises(AdmissionRefused, match=r"cannot admit 80 GiB .* unreserved = C − H − U − R − G") as err:
            other.admit_static(80 * GiB)
        assert err.value.figures["asked"] == 80 * GiB and err.value.figures["unreserved"] == 70 * GiB
        other.close()
    finally:
        session.close()


def test_vllm_client_admits_per_instance_and_releases(ledger_dir: Path) -> None:
    publish_gpu(ledger_dir, 50 * GiB)
    client = RankSessions(env_for(ledger_dir))
    key = InstanceKey("qwen", "qwen3-8b")
    assert client.admit(key, "cuda:0", 20 * GiB) == 20 * GiB
    client.report_pools(key, {"kv": PoolFacts(bytes=19 * GiB)})
    led = GpuLedger.open(ledger_dir, "cuda:0", create=False)
    (view,) = led.slots()[0]
    assert (view.id, view.engine, view.engine_id, view.runtime_reserved) == ("qwen/0", "vllm", "qwen", 19 * GiB)
    with pytest.raises(AdmissionRefused, match="cannot admit"):
        client.admit(InstanceKey("other", "qwen3-8b"), "cuda:0", 40 * GiB)
    with pytest.raises(AdapterError, match="qwen/0 is attached on cuda:0, not cuda:1"):
        client.admit(key, "cuda:1", GiB)
    with pytest.raises(AdapterError, match="reports pools but admitted nothing"):
        client.report_pools(InstanceKey("never", "qwen3-8b"), {})
    client.release(key)
    client.release(InstanceKey("other", "qwen3-8b"))
    assert led.totals().active == 0


def test_before_a_controller_the_measured_gpu_and_policy_headroom_are_used(
    ledger_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "p.kvp"
    policy.write_text('version 1\ndefaults {\n  headroom 2 GiB\n}\ngpu "cuda:0" {\n  capacity 60 GiB\n}\n')
    # measure_gpu stands in for cuMemGetInfo on this CPU-only machine (it runs for real on the GPU)
    monkeypatch.setattr(ledger_port, "measure_gpu", lambda: ledger_port.Measured(capacity=80 * GiB, used=10 * GiB))
    session = open_session(SglangIdentity("m", "cuda:0", 0).ledger_identity(), env_for(ledger_dir, policy))
    try:
        with pytest.raises(AdmissionRefused) as err:
            session.admit_static(49 * GiB)  # 60 (policy capacity) − 2 (headroom) − 10 (other use) = 48 GiB
        assert "48 GiB" in str(err.value) and "provisional" in str(err.value)
        assert session.admit_static(48 * GiB) == 48 * GiB
        f = GpuLedger.open(ledger_dir, "cuda:0", create=False).figures()
        assert (f.source, f.capacity, f.headroom, f.other_used) == ("provisional", 60 * GiB, 2 * GiB, 10 * GiB)
    finally:
        session.close()


def test_other_use_leaves_out_what_the_ledger_accounts_and_the_most_cautious_figures_win(ledger_dir: Path) -> None:
    first = EngineSession.open(identity("a"), measure=lambda gpu: MeasuredGpu(100 * GiB, GiB, 10 * GiB), ledger_dir=ledger_dir)
    # The second engine sees the first one's 30 GiB of pools in use on the device, which the ledger already counts.
    second = EngineSession.open(identity("b"), measure=lambda gpu: MeasuredGpu(90 * GiB, 0, 40 * GiB), ledger_dir=ledger_dir)
    try:
        assert first.admit_static(30 * GiB) == 30 * GiB
        first.report_pools({"kv": PoolFacts(bytes=30 * GiB)})
        with pytest.raises(AdmissionRefused) as err:
            second.admit_static(49 * GiB + 1)  # 90 − 1 − 10 − 30 = 49 GiB: the smaller C, the larger H and U
        assert {k: err.value.figures[k] for k in ("capacity", "headroom", "other_used", "reserved_by_others")} == {
            "capacity": 90 * GiB, "headroom": GiB, "other_used": 10 * GiB, "reserved_by_others": 30 * GiB,
        }
        assert second.admit_static(49 * GiB) == 49 * GiB
    finally:
        first.close()
        second.close()


def test_published_figures_win_and_the_engine_is_not_measured(ledger_dir: Path) -> None:
    publish_gpu(ledger_dir, 50 * GiB)

    def never(gpu: str) -> MeasuredGpu:
        raise AssertionError("measured although a controller published")

    with EngineSession.open(identity("a"), measure=never, ledger_dir=ledger_dir) as session:
        assert session.admit_static(50 * GiB) == 50 * GiB
        assert session.snapshot().runtime_reserved == 50 * GiB


def test_without_figures_static_admission_says_what_to_do(ledger_dir: Path) -> None:
    with (EngineSession.open(identity("a"), measure=lambda gpu: None, ledger_dir=ledger_dir) as session,
          pytest.raises(LedgerError, match="no controller has published figures for cuda:0")):
        session.admit_static(GiB)


def test_an_elastic_session_reads_its_guarantee_and_gives_its_limit_source(ledger_dir: Path) -> None:
    session = EngineSession.open(identity("e"), guarantee=3 * GiB, elastic=True, ledger_dir=ledger_dir)
    reading = session.limits()
    assert (reading.limit, reading.guarantee, reading.revision) == (3 * GiB, 3 * GiB, 0)  # before any publish
    source = session.limit_source()
    assert source.read() == reading
    assert GpuLedger.open(ledger_dir, "cuda:0", create=False).slots()[0][0].elastic
    session.touch()
    assert not session.closed and "open" in repr(session)
    session.close()
    session.close()  # idempotent
    assert session.closed
    with pytest.raises(Detached):
        session.limits()


def test_the_ledger_capacity_is_read_without_attaching(ledger_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ledger_capacity("cuda:0", ledger_dir) is None  # no segment yet
    assert not ledger_dir.exists()  # and reading made none
    GpuLedger.open(ledger_dir, "cuda:0").provide_figures(capacity=8 * GiB)
    assert ledger_capacity("cuda:0", ledger_dir) == 8 * GiB
    assert GpuLedger.open(ledger_dir, "cuda:0", create=False).totals().active == 0
    monkeypatch.setattr(ledger_port, "measure_gpu", lambda: None)
    assert gpu_capacity("cuda:0", env_for(ledger_dir)) == 8 * GiB
    monkeypatch.setattr(ledger_port, "measure_gpu", lambda: ledger_port.Measured(capacity=141 * GiB, used=0))
    assert gpu_capacity("cuda:0", env_for(ledger_dir)) == 141 * GiB  # this process's device first


def test_at_the_edge_a_ledger_error_becomes_the_start_up_failure_with_every_figure(ledger_dir: Path) -> None:
    publish_gpu(ledger_dir, 10 * GiB)
    asked: list[str] = []

    def context() -> str:
        asked.append("once")
        return "vLLM rank qwen/0 on cuda:0, sizing its KV cache"

    with EngineSession.open(identity("a"), ledger_dir=ledger_dir) as session:
        with as_startup_failure(context):
            session.admit_static(GiB)
        assert asked == []  # the context is worked out only for a failure
        with pytest.raises(AdapterError) as err, as_startup_failure(context):
            session.admit_static(11 * GiB)
    message = str(err.value)
    assert message.startswith("kvpolicy ledger: cannot admit 11 GiB")
    assert "unreserved = C − H − U − R − G = 10 GiB − 0 B − 0 B − 0 B − 0 B = 10 GiB" in message
    assert message.endswith("(vLLM rank qwen/0 on cuda:0, sizing its KV cache)") and asked == ["once"]
    with pytest.raises(ValueError), as_startup_failure("not a ledger error"):
        raise ValueError("passes through")


def test_policy_gpu_figures_reads_headroom_percent(tmp_path: Path) -> None:
    policy = tmp_path / "p.kvp"
    policy.write_text("version 1\ngpu * {\n  headroom 10%\n}\n")
    assert ledger_port.policy_gpu_figures(policy, "cuda:1", 100 * GiB) == (100 * GiB, 10 * GiB)
    assert ledger_port.policy_gpu_figures(None, "cuda:1", 100 * GiB) == (100 * GiB, 0)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda_available(), reason="checks a machine without a GPU")
def test_measure_gpu_without_a_driver_library_is_none() -> None:
    # cuda-python 13 raises (a RuntimeError) when it cannot load libcuda; measure_gpu says "no figures".
    assert ledger_port.measure_gpu() is None


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and torch")
def test_measure_gpu_on_a_real_device_matches_cuMemGetInfo(ledger_dir: Path) -> None:
    import torch

    torch.cuda.init()
    torch.cuda.set_device(0)
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # something in use
    m = ledger_port.measure_gpu()
    free, total = torch.cuda.mem_get_info()
    assert m is not None and m.capacity == total and abs(m.used - (total - free)) <= 64 << 20
    session = open_session(SglangIdentity("m", "cuda:0", 0).ledger_identity(), env_for(ledger_dir))
    try:
        assert session.admit_static(GiB) == GiB
        f = GpuLedger.open(ledger_dir, "cuda:0", create=False).figures()
        assert f.source == "provisional" and f.capacity == total and f.other_used >= 256 << 20
    finally:
        session.close()
        del block


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and torch")
def test_nvml_keys_cuda_0_by_the_uuid_cuda_gives_it(ledger_dir: Path) -> None:
    """On a real GPU: the ledger's id of cuda:0 (NVML, through CUDA_VISIBLE_DEVICES) is the device's UUID as
    CUDA reports it, and the controller's sampler finds the segment's GPU by it."""
    import torch

    from kvpolicy.runtime.gpu_identity import load_nvml, local_gpu
    from kvpolicy.runtime.gpus import NvmlSampler, gpu_id

    assert load_nvml() is not None, "a GPU machine without NVML (nvidia-ml-py and the driver's libnvidia-ml)"
    ident = local_gpu(0)
    cuda_uuid = str(torch.cuda.get_device_properties(0).uuid).removeprefix("GPU-").removeprefix("MIG-")
    assert ident.id[:4] in ("GPU-", "MIG-") and ident.id[4:] == cuda_uuid, (ident, cuda_uuid)
    assert gpu_id(0) == ident.id and ident.name.startswith("cuda:")
    session = open_session(SglangIdentity("m", ident.id, 0).ledger_identity(), env_for(ledger_dir))
    try:
        assert session.admit_static(GiB) == GiB
        assert (ledger_dir / f"{ident.id}.ledger").is_file()
        sample = NvmlSampler().sample([ident.id])[ident.id]
        _free, total = torch.cuda.mem_get_info()
        # NVML counts the whole framebuffer, CUDA a little less (what the driver keeps)
        assert sample.name == ident.name and total <= sample.capacity <= total * 1.05, (sample, total)
    finally:
        session.close()
