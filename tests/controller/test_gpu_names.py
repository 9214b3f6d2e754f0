"""The controller with GPUs keyed by UUID (issue 18): NVML's figures and display names, and what a
policy's ``gpu "cuda:N"`` block, the status and the metrics say of them.

NVML is a stand-in (tests/support/fake_nvml.py: this machine has no GPU); engines are real
processes attached to real ledger files.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families

from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.gpus import NvmlSampler
from kvpolicy.runtime.view import current_status, render_status
from kvpolicy.runtime.status import read_status
from tests.controller.site import POLICY, GiB, http_get, wait_for
from tests.support import fake_nvml
from tests.support.processes import read_line

U0 = "GPU-5a0e4f2c-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
U1 = "GPU-9c7d1e2f-3a4b-4c5d-9e6f-7a8b9c0d1e2f"

ENGINE = textwrap.dedent("""
    import sys, time, kvpolicy
    model, gpu, ledger = sys.argv[1:4]
    inst = kvpolicy.attach(model=model, gpu=gpu, ledger_dir=ledger, elastic=True, id=model + "/0", handle_signals=False)
    print("attached", flush=True)
    sys.stdin.read()
""")


Sample = tuple[str, tuple[tuple[str, str], ...]]


def metric_samples(url: str) -> dict[Sample, float] | None:
    """Every sample of the controller's ``/metrics`` by name and sorted labels; None unless it answered 200."""
    code, body = http_get(f"{url}/metrics")
    if code != 200:
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(body) for s in f.samples}


def gpu_info(samples: dict[Sample, float]) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (name, labels), value in samples.items() if name == "kvpolicy_gpu_info"}


def test_policy_blocks_match_the_display_name_or_the_uuid_and_status_and_metrics_carry_both(site) -> None:
    site.policy.write_text(POLICY + f'gpu "cuda:1" {{ headroom 10 GiB }}\ngpu "{U0}" {{ headroom 5 GiB }}\n')
    machine = [fake_nvml.FakeGpu(U0, memory=80 * GiB, used=GiB), fake_nvml.FakeGpu(U1, memory=80 * GiB, mig=False)]
    controller = site.controller(sampler=NvmlSampler(fake_nvml.module(machine)))
    url = site.serve(controller)
    engines = []
    try:
        for model, gpu in (("chat", U1), ("batch", U0)):
            p = subprocess.Popen([sys.executable, "-c", ENGINE, model, gpu, str(site.ledger_dir)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            engines.append(p)
            assert read_line(p).strip() == "attached"  # type: ignore[union-attr]
        status = wait_for(lambda: (st := read_status(site.ledger_dir)) and len(st.gpus) == 2 and len(st.instances) == 2
                          and st)
        assert status
        gpus = {g.id: g for g in status.gpus}
        assert (gpus[U1].name, gpus[U1].headroom, gpus[U1].capacity) == ("cuda:1", 10 * GiB, 80 * GiB)
        assert (gpus[U0].name, gpus[U0].headroom, gpus[U0].other_used) == ("cuda:0", 5 * GiB, GiB)
        assert {i.id: i.gpu for i in status.instances} == {"chat/0": U1, "batch/0": U0}
        # chat alone on cuda:1: A = 80 - 10 = 70, its limit max 60% = 48 GiB
        assert wait_for(lambda: site.slot("chat/0").limit == 48 * GiB)
        # The metrics are those of the controller's last step: wait for one that has seen both GPUs.
        samples = wait_for(lambda: (s := metric_samples(url)) and len(gpu_info(s)) == 2 and s)
        assert samples
        assert gpu_info(samples) == {(("gpu", U1), ("name", "cuda:1")): 1, (("gpu", U0), ("name", "cuda:0")): 1}
        assert samples[("kvpolicy_gpu_headroom_bytes", (("gpu", U1),))] == 10 * GiB
        with LedgerDir(site.ledger_dir) as ld:  # `kvpolicy status` and `top`: the live ledger, the controller's names
            live = current_status(ld)
        assert {g.id: g.name for g in live.gpus} == {U0: "cuda:0", U1: "cuda:1"}
        full = render_status(live).splitlines()
        assert any(line.split()[:1] == ["cuda:1"] and line.split()[-2:] == ["published", U1] for line in full), full
        top = render_status(live, width=80).splitlines()
        (chat,) = [line for line in top if line.startswith("chat/0")]
        assert "cuda:1" in chat and len(chat) <= 80 and not any(U1 in line for line in top)
    finally:
        for p in engines:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=60)


def test_the_status_warns_when_an_engine_fell_back_to_an_index_id(site) -> None:
    machine = [fake_nvml.FakeGpu(U0, memory=80 * GiB)]
    site.controller(sampler=NvmlSampler(fake_nvml.module(machine)))
    engines = []
    try:
        for model, gpu in (("chat", U0), ("batch", "cuda:0")):  # the same GPU: one engine without NVML
            p = subprocess.Popen([sys.executable, "-c", ENGINE, model, gpu, str(site.ledger_dir)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            engines.append(p)
            assert read_line(p).strip() == "attached"  # type: ignore[union-attr]
        status = wait_for(lambda: (st := read_status(site.ledger_dir)) and len(st.instances) == 2 and st.problems and st)
        assert status
        assert any("index-based ids (cuda:0)" in p and "make NVML available to every engine" in p for p in status.problems)
        assert {g.id: g.name for g in status.gpus} == {U0: "cuda:0", "cuda:0": "cuda:0"}
    finally:
        for p in engines:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=60)
