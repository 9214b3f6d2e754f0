"""The harness's DeepSeek-V4 tenant with an elastic SWA pool, serving a trace through SGLang's own allocator.

``dsv4.py`` builds the real SGLang 0.5.23 V4 pools on CPU through the adapter's hooks (the
policy marks ``pool swa { owner elastic }``: the SWA tensors over the host driver, SGLang's
``SWATokenToKVPoolAllocator`` bound to them, an elastic instance in a real shared-memory
ledger). The test publishes a limit above the guarantee, as a controller would, then the
tenant serves ``v4-elastic.toml``'s trace on the step clock: every request is admitted,
decodes past the sliding window and finishes; the bytes mapped stay under the policy's max
and the published limit; idle, the pool gives back to its target; the ledger agrees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.policy.resolve import model_settings
from kvpolicy.units import MiB

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "colocate"
PARAMS = Path(__file__).resolve().parent / "v4-elastic.toml"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

from params import load_params  # noqa: E402 - found through the sys.path entry above, as the harness finds it
from traces import requests_for  # noqa: E402 - the same

GPU = "cuda:0"
CAPACITY = 1 << 30
GROUP = 7 * 2 * MiB  # one 2 MiB chunk in each of the tiny geometry's 7 SWA layers
GUARANTEE, MAXIMUM = 28 * MiB, 84 * MiB  # policy-v4-elastic.kvp's min and max
LIMIT = 4 * GROUP  # what the test publishes: above the guarantee, under the max


def publish(ledger: Path, instance: str, limit: int, target: int) -> None:
    """A controller's publish: the GPU's figures and the V4 instance's limit and target."""
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.ledger import GpuLimits
    from kvpolicy.runtime.values import InstanceLimits

    with LedgerDir(ledger) as ld:
        skipped = ld.publish(ld.read(), 1, {GPU: GpuLimits(CAPACITY, 0, 0, CAPACITY)},
                             {instance: InstanceLimits(limit=limit, target=target, guarantee=GUARANTEE)})
    assert not skipped


def _line(proc: subprocess.Popen, word: str, log: Path) -> str:
    """The rest of dsv4.py's first stdout line that starts with ``word``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(word + " "):
            return line[len(word) + 1:]
    proc.wait(timeout=60)
    raise AssertionError(f"dsv4.py exited with {proc.returncode} before '{word}':\n{log.read_text()[-4000:]}")


@pytest.mark.sglang
def test_the_v4_tenant_serves_a_trace_on_an_elastic_swa_pool(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="SGLang's pools are torch tensors")
    pytest.importorskip("sglang", reason="needs sglang 0.5.23 (requirements/sglang-cpu.txt)")
    import kvpolicy

    params = load_params(PARAMS)
    assert params.dsv4.trace is not None
    ledger = tmp_path / "ledger"
    # No controller and no GPU to measure: another instance gives the GPU's figures.
    figures = kvpolicy.attach(model="figures", gpu=GPU, ledger_dir=ledger, capacity=CAPACITY, headroom=0, other_used=0)
    log = tmp_path / "v4.log"
    try:
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, str(BENCH / "dsv4.py"), "--params", str(PARAMS), "--policy", str(params.policy),
                 "--ledger-dir", str(ledger), "--capacity", str(CAPACITY), "--out", str(tmp_path / "v4.json"),
                 "--sglang-on-cpu"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
            )
        assert proc.stdin is not None
        with proc:
            ready = json.loads(_line(proc, "ready", log))
            assert ready["swa_owner"] == "elastic" and ready["build"] == "sglang"
            publish(ledger, ready["instance"], LIMIT, GUARANTEE)  # before it serves: the same run on any machine
            proc.stdin.write("go 0\n")
            proc.stdin.flush()
            served = json.loads(_line(proc, "served", log))
            assert served["unfinished"] == 0
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        figures.detach()
    built = json.loads((tmp_path / "v4.json").read_text())
    s = built["serve"]
    arrived = s["arrived"]
    assert arrived > 8 and s["requests_done"] == arrived and s["unfinished"] == 0 and not s["stopped"]
    assert s["tokens_served"] == sum(r.output for r in requests_for(params.dsv4.trace, len(params.tenants)))
    # The limit was reached: allocations were refused (SGLang's full-pool answer), queued and retried.
    assert s["refusals"]["extend"] + s["refusals"]["decode"] > 0 and s["refusals"]["pool"] > 0
    swa = s["swa"]
    assert swa["policy_max"] == MAXIMUM
    # The pool grew past its guarantee into the published limit, never past it nor past the policy's max.
    assert GUARANTEE < swa["peak_elastic"] <= min(LIMIT, MAXIMUM)
    assert swa["peak_limit"] == LIMIT and swa["over_limit_rounds"] == 0
    columns = s["timeline"]["columns"]
    elastic, limit = columns.index("elastic"), columns.index("limit")
    assert all(row[elastic] <= row[limit] for row in s["timeline"]["rows"])
    # The SWA pages that left the window went back while the requests decoded: chunks were unmapped.
    assert swa["chunks_unmapped"] > 0 and swa["chunks_mapped"] > swa["chunks_unmapped"]
    # Idle: given back to the target (the guarantee), to within one chunk group.
    assert swa["idle_elastic"] <= GUARANTEE + GROUP
    # The ledger's slot holds what the pool holds; the static pools stayed admitted throughout.
    ledger_view = s["ledger"]
    assert ledger_view["mapped"] == ledger_view["pool_elastic"] == swa["idle_elastic"]
    assert ledger_view["used"] == ledger_view["pool_used"] == 0
    assert (ledger_view["limit"], ledger_view["target"], ledger_view["guarantee"]) == (LIMIT, GUARANTEE, GUARANTEE)
    assert built["ledger_runtime_reserved_at_end"] == built["ledger_runtime_reserved"] > 0
    assert built["ledger_runtime_reserved"] <= built["reserve"] == 128 * MiB
    assert built["swa_elastic"]["swa"]["owner"] == "elastic"


@pytest.mark.sglang
def test_the_harness_runs_the_elastic_v4_tenant_beside_the_tenants_under_the_controller(tmp_path: Path) -> None:
    """``colocate.py --mode kvpolicy`` with ``v4-harness.toml``: the controller publishes the V4 engine's limit
    with the tenants'; its SWA bytes count in the one elastic budget, which is never exceeded."""
    pytest.importorskip("torch", reason="the tenants and SGLang's pools are torch tensors")
    pytest.importorskip("numpy", reason="the tenants' block tables are numpy arrays")
    pytest.importorskip("sglang", reason="needs sglang 0.5.23 (requirements/sglang-cpu.txt)")
    params = load_params(PARAMS.with_name("v4-harness.toml"))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(BENCH / "colocate.py"), "--params", str(params.source), "--mode",
                           "kvpolicy", "--out", str(out)], check=False, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    m = json.loads((out / "kvpolicy.json").read_text())
    d = m["dsv4"]
    assert d["build"] == "sglang" and d["swa_owner"] == "elastic"
    s = d["serve"]
    assert s["requests_done"] == s["arrived"] > 4 and s["unfinished"] == 0 and not s["stopped"]
    assert s["swa"]["over_limit_rounds"] == 0 and s["swa"]["peak_elastic"] <= MAXIMUM
    assert s["ledger"]["mapped"] == s["ledger"]["pool_elastic"] == s["swa"]["idle_elastic"]
    assert d["ledger_runtime_reserved_at_end"] == d["ledger_runtime_reserved"]
    # The controller gave the V4 engine limits (the revision its slot acknowledged), and counted its mapped SWA
    # bytes with the tenants' in the budget.
    v4 = [row["tenants"][params.dsv4.model] for row in m["ledger_samples"] if params.dsv4.model in row["tenants"]]
    assert v4 and max(r[4] for r in v4) > 0 and max(r[0] for r in v4) > 0
    assert all(mapped <= limit for mapped, _used, limit, *_ in v4)
    check = m["budget_check"]
    assert check["samples"] > 0 and check["over_budget"] == 0 and m["budget"]["exact"]
    for name, t in m["tenants"].items():
        assert t["summary"]["oom"] == 0 and t["summary"]["corrupted"] == 0, name


def test_the_h200_parameters_make_the_v4_swa_pool_elastic_and_its_plan_fits() -> None:
    """``benchmarks/colocate/v4elastic.toml`` (the GPU run): a clean policy marking the V4 SWA pool elastic, a
    trace for the V4 tenant, and an elastic plan for its reserve on an H200 whose guarantee and max it can map."""
    from kvpolicy.adapters.sglang_dsv4.elastic_policy import elastic_swa_policy, swa_is_elastic
    from kvpolicy.adapters.sglang_dsv4.geometry import load_geometry
    from kvpolicy.adapters.sglang_dsv4.plan import PlanSettings, budget_for_reserve
    from kvpolicy.lint.engine import lint_file
    from kvpolicy.units import GiB

    params = load_params(BENCH / "v4elastic.toml")
    default = load_params(BENCH / "default.toml")
    assert (params.engine, params.kv, params.trace, params.tenants) == (default.engine, default.kv, default.trace, default.tenants)
    result = lint_file(params.policy)
    assert result.diagnostics == (), [d.message for d in result.diagnostics]
    settings = model_settings(result.policy, params.dsv4.model)
    assert swa_is_elastic(settings) and params.dsv4.build == "sglang" and params.dsv4.trace is not None
    d = params.dsv4
    swa = elastic_swa_policy(settings, chunk=2 * MiB, capacity=141 * GiB)
    assert swa is not None
    plan = budget_for_reserve(load_geometry(d.geometry), PlanSettings(
        page_size=d.page_size, max_running_requests=d.max_running_requests, swa_ratio=d.swa_ratio), settings.reserve, swa)
    pool = plan.elastic["swa"]
    assert plan.total_footprint <= settings.reserve and 0 < pool.guarantee <= swa.guarantee  # whole chunk groups
    assert pool.guarantee < pool.limit <= swa.maximum
    # The trace's longest request fits the full pool many times over; it ends before the tenants' trace.
    assert d.trace.prompt_tokens[1] + d.trace.output_tokens[1] < plan.tokens.full // d.max_running_requests
    assert d.trace.duration_s < params.trace.duration_s
