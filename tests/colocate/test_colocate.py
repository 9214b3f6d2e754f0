"""The co-location benchmark (benchmarks/colocate) in its CI size: host driver, real processes.

The end-to-end test runs both modes of the real harness — the controller (``kvpolicy
run``), the ledger, tenant processes with block pools on the host driver doing real
torch work, the DeepSeek-V4 stand-in — on a 12-second trace, then ``--combine``, and
checks the properties issue 8 asks for: no out-of-memory, no corrupted request, every
request accounted for, the ledger never over the budget, tokens served in both modes,
the policy edit published and acknowledged. No timing is asserted (this is CI).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the benchmark's tenants run torch work over the pool's views")
pytest.importorskip("numpy", reason="the tenants' block tables are numpy arrays")

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "colocate"
SMALL = Path(__file__).resolve().parent / "small.toml"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

from params import load_params
from policyedit import idle_rule, swap_settings
from traces import busy_windows, requests_for

from kvpolicy.policy.resolve import model_settings

TRACES = [BENCH / f"{name}.toml" for name in ("default", "allbusy", "bursty4", "longprompt")]
"""The traces the benchmark ships (issue 17): one engine, geometry and allocator setting for all."""
CPU_TRACES = [BENCH / f"cpu-{name}.toml" for name in ("allbusy", "bursty4", "longprompt")]
"""The same traces on the host driver, every byte figure cut by cpu.toml's scale."""
PARAMS = [*TRACES, BENCH / "cpu.toml", *CPU_TRACES, SMALL]


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.name)
def test_parameter_files_and_their_policies_are_clean(path: Path) -> None:
    from kvpolicy.lint.engine import lint_file
    from kvpolicy.lint.load import policy_from_text

    params = load_params(path)
    result = lint_file(params.policy)
    assert result.diagnostics == (), [d.message for d in result.diagnostics]
    policy = result.policy
    text = params.policy.read_text()
    edited = swap_settings(text, *params.reload.swap, params.reload.fields)
    a, c = params.reload.swap
    before, after = policy_from_text(text), policy_from_text(edited)
    for field in params.reload.fields:
        assert getattr(model_settings(after, a), field) == getattr(model_settings(before, c), field)
        assert getattr(model_settings(after, c), field) == getattr(model_settings(before, a), field)
    changed = [(x, y) for x, y in zip(text.splitlines(), edited.splitlines()) if x != y]
    assert len(changed) == 2 * len(params.reload.fields)  # only the swapped settings' lines
    rule = idle_rule(policy)
    for name in params.tenants:
        settings = model_settings(policy, name)
        guarantee = settings.min_bytes(params.budget.elastic)
        # The rule's threshold sits below the guarantee it shrinks to: a tenant kept at its
        # guarantee leaves the rule before it runs out of memory.
        assert rule.below < guarantee
        assert guarantee % params.kv.group_bytes == 0 and guarantee % params.kv.elastic_group_bytes == 0
    assert params.budget.static_share % params.kv.group_bytes == 0
    assert model_settings(policy, params.dsv4.model).reserve


def test_the_default_run_is_the_issue_s() -> None:
    p = load_params(BENCH / "default.toml")
    assert (p.kv.layers, p.kv.kv_heads, p.kv.head_dim, p.kv.dtype, p.kv.block_tokens) == (32, 8, 128, "bfloat16", 16)
    assert p.budget.elastic == 48 << 30 and p.budget.static_share == 16 << 30
    t = p.trace
    assert (t.busy_rate, t.idle_rate, t.prompt_tokens, t.output_tokens) == (8.0, 0.2, (1024, 8192), (256, 2048))
    assert (t.busy_s, t.period_s, t.phase_offset_s, t.duration_s, t.seed) == (40, 120, 40, 240, 0)
    assert p.reload.at_s == 120 and p.device.driver == "cuda"
    cpu = load_params(BENCH / "cpu.toml")
    assert cpu.trace == t  # the same requests
    assert cpu.engine.give_back_delay_s == p.engine.give_back_delay_s  # the same allocator settings
    scale = p.kv.block_bytes / cpu.kv.block_bytes
    assert p.budget.elastic / cpu.budget.elastic == scale == p.budget.static_share / cpu.budget.static_share


def test_the_traces_share_one_parameter_set() -> None:
    """Every shipped trace runs the default's engine, KV geometry, device and allocator settings;
    only the trace, the tenants, their policy, the budget split and the edited pair differ."""
    default = load_params(TRACES[0])
    for path in TRACES[1:]:
        p = load_params(path)
        assert (p.engine, p.kv, p.device, p.dsv4) == (default.engine, default.kv, default.device, default.dsv4), path.name
        assert p.trace != default.trace and p.budget.elastic == default.budget.elastic
        assert p.budget.static_share * len(p.tenants) == p.budget.elastic  # the same memory in both modes
    busy = load_params(BENCH / "allbusy.toml").trace
    for i in range(3):  # busy all the time
        assert busy_windows(busy, i) == [(0.0, busy.duration_s)]
    steps = load_params(BENCH / "allbusy-steps.toml")  # the same run, only on the other clock
    assert steps.engine.clock == "steps" != default.engine.clock
    assert (steps.trace, steps.kv, steps.budget) == (busy, default.kv, default.budget)
    assert steps.engine.model_copy(update={"clock": default.engine.clock}) == default.engine
    shipped, noedit = load_params(BENCH / "allbusy.toml"), load_params(BENCH / "allbusy-noedit.toml")
    same_but_the_edit = {"name": shipped.name, "source": shipped.source, "reload": shipped.reload}
    assert noedit.model_copy(update=same_but_the_edit) == shipped  # the same run, its edit 0.1 s before the end
    assert busy.duration_s - noedit.reload.at_s <= 0.1 + 1e-9
    assert noedit.reload.model_copy(update={"at_s": shipped.reload.at_s}) == shipped.reload
    four = load_params(BENCH / "bursty4.toml")
    assert len(four.tenants) == 4 and set(four.reload.swap) <= set(four.tenants)
    long = load_params(BENCH / "longprompt.toml")
    assert long.trace.prompt_tokens[0] >= 8192 and long.max_request_blocks * long.kv.block_bytes > 4 << 30


@pytest.mark.parametrize("path", CPU_TRACES, ids=lambda p: p.name)
def test_the_cpu_traces_are_the_device_traces_scaled(path: Path) -> None:
    """A CPU variant serves its device trace's requests with cpu.toml's engine and geometry and
    every budget cut by the same factor, so the token capacities are the GPU run's."""
    cpu, device = load_params(path), load_params(BENCH / path.name.removeprefix("cpu-"))
    base, default = load_params(BENCH / "cpu.toml"), load_params(TRACES[0])
    assert cpu.trace == device.trace and cpu.tenants == device.tenants and cpu.reload == device.reload
    assert (cpu.engine, cpu.kv, cpu.device) == (base.engine, base.kv, base.device)
    scale = default.kv.block_bytes / cpu.kv.block_bytes
    assert device.budget.elastic / cpu.budget.elastic == scale == device.budget.static_share / cpu.budget.static_share
    cpu_policy, device_policy = lint_policy(cpu.policy), lint_policy(device.policy)
    for name in cpu.tenants:
        c, d = model_settings(cpu_policy, name), model_settings(device_policy, name)
        assert (c.priority, c.weight) == (d.priority, d.weight)
        assert d.min_bytes(device.budget.elastic) / c.min_bytes(cpu.budget.elastic) == scale


def lint_policy(path: Path):
    from kvpolicy.lint.engine import lint_file

    result = lint_file(path)
    assert result.diagnostics == (), [d.message for d in result.diagnostics]
    return result.policy


def test_extends_merges_tables_key_by_key(tmp_path: Path) -> None:
    (tmp_path / "base.toml").write_text(SMALL.read_text().replace('policy = "policy-small.kvp"', f'policy = "{SMALL.parent / "policy-small.kvp"}"'))
    (tmp_path / "trace.toml").write_text('extends = "base.toml"\nname = "other"\n[trace]\nbusy_rate = 5.0\n')
    base, other = load_params(tmp_path / "base.toml"), load_params(tmp_path / "trace.toml")
    assert other.name == "other" and other.trace.busy_rate == 5.0
    assert other.trace.model_copy(update={"busy_rate": base.trace.busy_rate}) == base.trace
    assert (other.engine, other.kv, other.policy) == (base.engine, base.kv, base.policy)
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    with pytest.raises(SystemExit, match="loops back"):
        load_params(tmp_path / "loop.toml")


def test_traces_are_reproducible_and_follow_the_phases() -> None:
    p = load_params(BENCH / "default.toml")
    for i in range(3):
        reqs = requests_for(p.trace, i)
        assert reqs == requests_for(p.trace, i)
        assert all(0 <= r.arrival < p.trace.duration_s for r in reqs)
        assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
        windows = busy_windows(p.trace, i)
        assert sum(hi - lo for lo, hi in windows) == pytest.approx(80)  # two 40 s phases in 240 s
        busy = sum(any(lo <= r.arrival < hi for lo, hi in windows) for r in reqs)
        assert 560 < busy < 720  # 8/s × 80 s, Poisson
        assert len(reqs) - busy < 60  # 0.2/s × 160 s
        assert all(1024 <= r.prompt <= 8192 and 256 <= r.output <= 2048 for r in reqs)
    assert busy_windows(p.trace, 1)[0] == (40, 80)


def _pool(blocks: int, limit: int):
    from kvpolicy.alloc import BlockPool, StaticLimit, open_driver

    p = load_params(SMALL)
    driver = open_driver("host", host_capacity=64 << 20)
    return p, BlockPool(driver, p.kv.layout, blocks, chunk=p.kv.chunk, limit=StaticLimit(limit), name="t")


def test_the_kv_check_finds_a_changed_word_and_a_swapped_block() -> None:
    from kvwork import KVWork, block_key

    from kvpolicy.alloc.tensors import block_bytes

    _, pool = _pool(256, 16 << 20)
    work = KVWork(pool, attn_layers=1, max_batch=8, window=0)
    ids = pool.alloc(4)
    keys = [block_key(7, i) for i in range(4)]
    work.write(ids, keys)
    assert work.check(ids, keys) == [0, 0, 0, 0]
    work.attend([__import__("numpy").array(ids)], [4 * 16 - 3])
    assert torch.isfinite(work.sink)  # the pattern reads as finite bf16 values
    arena, offset = pool.geometry.placement(0, "v")
    words = block_bytes(pool, arena).view(torch.int16)  # [blocks, words of a block in the arena]
    # Word for word the documented pattern, computed over the whole block, not from its period.
    j = torch.arange(words.shape[1], dtype=torch.int64)
    k = keys[3]
    documented = (((j * ((k >> 10) | 1) + k) & 0x3FF) | 0x3C00) ^ work.arena_xor[arena]
    assert torch.equal(words[ids[3]].to(torch.int64), documented)
    words[ids[2], offset // 2 + 100] ^= 1  # one bit of one word of layer 0's V
    assert work.check(ids, keys) == [0, 0, 1, 0]
    assert min(work.check(ids[:2], [keys[1], keys[0]])) > 0  # each block read as the other's
    del work
    pool.close()


def test_engine_accounting_with_queueing_and_preemption() -> None:
    """One tenant's scheduler on a pool far too small for its busy phase, on a simulated clock."""
    from engine import Engine
    from kvwork import KVWork

    p, pool = _pool(256, 16 << 20)  # 4,096 tokens: a fifth of what the busy phase wants
    pool.ensure_mapped(range(pool.num_blocks))
    work = KVWork(pool, attn_layers=1, max_batch=256, window=1)
    reqs = requests_for(p.trace, 0)
    engine = Engine(pool, work, reqs, block_tokens=16, max_request_blocks=p.max_request_blocks,
                    prefill_tokens_per_step=2048, max_running=256, patience_s=2.0)
    t = 0.0
    while t < 6.0:  # tenant-a's busy phase (0-3 s) and its drain
        engine.step(t)
        t += 0.01
        live = sum(r.n_blocks for r in engine.running)
        assert pool.live_blocks == live  # the engine's block tables are exactly the pool's live blocks
    engine.finish()
    s = engine.summary()
    assert s["arrived"] == len([r for r in reqs if r.arrival <= t - 0.01])
    assert s["arrived"] == s["completed"] + s["abandoned"] + s["running_at_end"] + s["waiting_at_end"]
    assert s["queued"] > 0 and s["preempted"] > 0 and s["abandoned"] > 0  # the paths under test ran
    assert s["corrupted"] == 0 and s["oom"] == 0
    assert s["checked"] == s["completed"] + s["running_at_end"]
    # Every token counted once: finished requests' outputs, plus what the others generated so far
    # (a preempted request keeps its tokens and recomputes them with its prompt).
    in_flight = sum(r.generated for r in [*engine.running, *engine.waiting])
    assert s["tokens"] == engine.c.completed_output + in_flight > 0
    del work
    pool.close()


@pytest.mark.parametrize("between", [True, False], ids=["after-the-step", "inside-the-step"])
def test_a_finished_request_is_checked_before_its_blocks_are_freed(between: bool) -> None:
    """With ``check_between_steps`` a finished request's KV check, and then the freeing of its blocks,
    come after the step's own time (its end is the wait for the GPU): at that wait its blocks are
    still live and unchecked, and the step's phases hold no check time; a corrupted block is still
    caught. Inside the step (the old way) they are checked and freed before it. The tail summary
    counts the finished request in the steps it describes."""
    from engine import STEP_PHASES, Engine
    from kvwork import KVWork
    from traces import Request

    from kvpolicy.alloc.tensors import block_bytes

    _, pool = _pool(256, 16 << 20)
    pool.ensure_mapped(range(pool.num_blocks))
    work = KVWork(pool, attn_layers=1, max_batch=8, window=1)
    at_gpu_wait: list[tuple[int, int]] = []  # (live blocks, requests checked) when each step waits for the GPU
    synchronize = work.synchronize

    def observed() -> None:
        at_gpu_wait.append((pool.live_blocks, engine.c.checked))
        synchronize()

    work.synchronize = observed  # type: ignore[method-assign]
    reqs = [Request(key=1, arrival=0.0, prompt=16 * 3, output=2), Request(key=2, arrival=0.0, prompt=16 * 2, output=9)]
    engine = Engine(pool, work, reqs, block_tokens=16, max_request_blocks=8, prefill_tokens_per_step=2048,
                    max_running=8, patience_s=None, check_between_steps=between)
    engine.step(0.0)  # both admitted: 4 + 3 blocks (the prompt, and the first decoded token's)
    engine.step(0.01)  # request 1's first token
    assert pool.live_blocks == 7 and engine.c.checked == 0
    words = block_bytes(pool, 0).view(torch.int16)
    words[int(engine.running[0].blocks[1]), 5] ^= 1  # one word of request 1's second block
    engine.step(0.02)  # request 1's second and last token
    check = STEP_PHASES.index("check")
    if between:
        assert at_gpu_wait[-1] == (7, 0)  # still live, unchecked, at the end of the step's own time
        assert engine.step_phases[-1][check] == 0 and engine.step_checks[-1][1] > 0
    else:
        assert at_gpu_wait[-1] == (3, 1) and engine.step_phases[-1][check] > 0
    assert pool.live_blocks == 3 and engine.c.checked == 1 and engine.c.corrupted == 1  # both ways, after the step
    s = engine.summary()
    assert s["check_between_steps"] is between
    assert s["step_ms_p99_with_check"] >= s["step_ms_p99"]
    tail = s["tail"]
    assert tail is not None and 1 <= tail["steps"] <= 3 and set(tail["phase_ms"]) == set(STEP_PHASES)
    assert tail["step_ms"] >= s["step_ms_p99"]  # the slowest steps' mean is at or above their threshold
    assert tail["finished"] == tail["with_finished"] <= 1  # no step finished more than the one request
    del work
    pool.close()


@pytest.mark.parametrize("limit_chunks", [8, 1], ids=["grows", "refused"])
def test_admission_maps_between_steps_not_inside_them(limit_chunks: int) -> None:
    """``map_between_steps``: a request that needs more blocks than are free is not admitted by a step
    that would map them; after the step the pool grows for it (and for the next request the step
    would have admitted), and the next step admits both from mapped memory. Under a limit too low
    for them the growth is refused and they wait for memory, as a refused ``alloc`` makes them."""
    from engine import Engine
    from kvwork import KVWork
    from traces import Request

    _, pool = _pool(256, limit_chunks * (2 << 20))  # small.toml: 2 MiB chunks of 32 blocks
    per_chunk = pool.grid.blocks_per_chunk
    pool.ensure_mapped(range(1))
    work = KVWork(pool, attn_layers=1, max_batch=8, window=1)
    reqs = [Request(key=1, arrival=0.0, prompt=16 * 40, output=4), Request(key=2, arrival=0.0, prompt=16 * 30, output=4)]
    engine = Engine(pool, work, reqs, block_tokens=16, max_request_blocks=64, prefill_tokens_per_step=2048,
                    max_running=8, patience_s=None, map_between_steps=True)
    assert per_chunk == 32 and pool.free_blocks == 32 < 40  # neither request fits the mapped chunk
    engine.step(0.0)
    assert engine.step_ops == [0] and not engine.running  # nothing mapped inside the step, nothing admitted
    if limit_chunks == 1:
        assert pool.held_bytes == 2 << 20 and engine.c.queued == 2 and engine.c.refusals == {"limit": 2}
        assert engine.c.grown_between == 0  # both asks (the two requests' blocks, then the head's) refused
    else:
        assert pool.free_blocks >= 70 and engine.c.grown_between == 2 and engine.c.queued == 0
        engine.step(0.01)
        assert engine.step_ops[-1] == 0 and [r.req.key for r in engine.running] == [1, 2]
        assert pool.live_blocks == 70
    del work
    pool.close()


def test_a_bound_between_steps_spreads_the_growth_for_admission_over_intervals() -> None:
    """``driver_chunks_between_steps``: the growth for requests a step could not admit maps at most
    that many chunk groups between two steps; the steps after it ask again for what is still
    missing, so the requests are admitted a few intervals later instead of delaying every running
    request's next token by the whole growth."""
    from engine import Engine
    from kvwork import KVWork
    from traces import Request

    _, pool = _pool(256, 8 * (2 << 20))  # small.toml: 2 MiB chunks of 32 blocks
    pool.ensure_mapped(range(1))
    work = KVWork(pool, attn_layers=1, max_batch=8, window=1)
    reqs = [Request(key=1, arrival=0.0, prompt=16 * 40, output=8), Request(key=2, arrival=0.0, prompt=16 * 30, output=8)]
    engine = Engine(pool, work, reqs, block_tokens=16, max_request_blocks=64, prefill_tokens_per_step=2048,
                    max_running=8, patience_s=None, map_between_steps=True, driver_chunks_between_steps=1)
    mapped, admitted = [], []
    for i in range(4):
        before = pool.mapping.groups_mapped
        engine.step(i * 0.01)
        mapped.append(pool.mapping.groups_mapped - before)
        admitted.append([r.req.key for r in engine.running])
    assert engine.step_ops == [0, 0, 0, 0]  # nothing mapped inside a step
    assert mapped == [1, 1, 0, 0]  # one chunk group per interval (the unbounded engine maps both at once)
    assert admitted == [[], [1], [1, 2], [1, 2]]  # the head once 64 blocks are free, the second an interval on
    assert engine.c.queued == 0 and engine.c.refusals == {}
    del work
    pool.close()


def test_under_contention_a_pool_above_its_target_admits_nothing_new_until_it_drains() -> None:
    """With ``yield_above_target_s``, a step after a sync that saw the GPU's budget refuse someone
    admits no request that would take the pool's use above its target (refusal ``target``); the
    running requests go on, and once the news is older than the window admission resumes."""
    from engine import Engine
    from kvwork import KVWork
    from traces import Request

    from kvpolicy.alloc import BlockPool, StaticLimit, open_driver

    p = load_params(SMALL)
    now = [0.0]
    limit = StaticLimit(32 << 20, target=2 << 20)  # may hold 16 chunks; its share is one
    pool = BlockPool(open_driver("host", host_capacity=64 << 20), p.kv.layout, 512, chunk=p.kv.chunk, limit=limit,
                     name="t", yield_above_target_s=0.25, give_back_delay_s=100.0, clock=lambda: now[0])
    work = KVWork(pool, attn_layers=1, max_batch=8, window=1)
    reqs = [Request(key=1, arrival=0.0, prompt=16 * 40, output=50), Request(key=2, arrival=0.025, prompt=16 * 8, output=4)]
    engine = Engine(pool, work, reqs, block_tokens=16, max_request_blocks=64, prefill_tokens_per_step=2048,
                    max_running=8, patience_s=None, map_between_steps=True)

    def step(t: float) -> None:
        now[0] = t
        engine.step(t)

    step(0.0)
    step(0.01)  # nobody waits: the first request is admitted above the target
    assert [r.req.key for r in engine.running] == [1] and pool.used_bytes > limit.read().target
    limit.press()  # another instance is refused memory for the GPU's budget
    step(0.02)  # its sync, after the step, sees the news
    for t in (0.03, 0.2):
        step(t)
        assert [r.req.key for r in engine.running] == [1], t  # the newcomer waits; the running one goes on
    assert engine.c.refusals == {"target": 2} and engine.running[0].generated == 3  # a token each step since 0.01
    step(0.3)  # 0.28 s after the sync that saw the news: the window is over
    assert sorted(r.req.key for r in engine.running) == [1, 2]
    del work
    pool.close()


def _run(*args: str, timeout: float = 1800, status: int = 0) -> subprocess.CompletedProcess:
    # A hang catcher, not a deadline: on a loaded machine the `steps` clock serves the same trace, slower.
    proc = subprocess.run([sys.executable, str(BENCH / "colocate.py"), *args], check=False, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_both_modes_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run("--params", str(SMALL), "--mode", "static", "--out", str(out))
    _run("--params", str(SMALL), "--mode", "kvpolicy", "--out", str(out))
    _run("--combine", str(out))
    params = load_params(SMALL)
    for mode in ("static", "kvpolicy"):
        m = json.loads((out / f"{mode}.json").read_text())
        for name, t in m["tenants"].items():
            s = t["summary"]
            assert s["oom"] == 0 and s["corrupted"] == 0, (mode, name, s)
            assert s["arrived"] == s["completed"] + s["abandoned"] + s["running_at_end"] + s["waiting_at_end"], (mode, name, s)
            assert s["never_arrived"] == 0
            # The CI trace runs on the step clock: one step per 10 ms of trace time, the last at its end,
            # however slowly the machine ran them.
            step, steps = params.engine.step_ms / 1000, 1
            while (steps - 1) * step < params.trace.duration_s:
                steps += 1
            assert t["clock"]["kind"] == "steps" and t["clock"]["steps"] == s["steps"] == steps, (t["clock"], s["steps"])
            assert t["clock"]["trace_s"] >= params.trace.duration_s
            assert s["tokens"] > 0 and s["checked"] == s["completed"] + s["running_at_end"]
            held = [row[1] for row in t["samples"]["rows"]]
            assert t["peak_held"] >= max(held)
        check = m["budget_check"]
        assert check["samples"] > 0 and check["over_budget"] == 0, check
        assert check["max_committed"] <= params.budget.elastic
        d = m["dsv4"]
        assert d["build"] == "plan" and d["ledger_runtime_reserved"] == d["footprint"] == d["plan"]["footprint"]
        assert d["ledger_runtime_reserved_at_end"] == d["ledger_runtime_reserved"]  # held throughout
    kv = json.loads((out / "kvpolicy.json").read_text())
    assert kv["budget"]["elastic_budget"] == params.budget.elastic and kv["budget"]["exact"]
    for name, t in kv["tenants"].items():
        lc = t["ledger_check"]
        assert lc["ledger_mapped"] == lc["pool_held"] and lc["ledger_pending"] == 0, (name, lc)
        assert lc["ledger_mapped_after_close"] == 0
        assert t["peak_held"] <= params.budget.elastic
    r = kv["reload"]
    assert "error" not in r, r
    assert r["revision"] > 0 and all(v is not None for v in r["acked_ms"].values()), r
    assert kv["controller_exit"] == 0
    static = json.loads((out / "static.json").read_text())
    for t in static["tenants"].values():
        assert t["peak_held"] == params.budget.static_share  # mapped up front, never more
    results = json.loads((out / "results.json").read_text())
    tokens = {mode: sum(t["tokens"] for t in results["modes"][mode]["tenants"].values()) for mode in ("static", "kvpolicy")}
    assert results["tokens_ratio"] == pytest.approx(tokens["kvpolicy"] / tokens["static"])
    for mode in ("static", "kvpolicy"):
        assert all(t["oom"] == 0 for t in results["modes"][mode]["tenants"].values())
    assert "ratios_old" not in results and "kvpolicy-old" not in results["modes"]
    table = (out / "results.md").read_text()
    assert "TTFT p50 / p99 s" in table and "chunks mapped / unmapped per 1k tokens" in table
    # Whether a pool is above its new target at the edit depends on the wall-clock controller's
    # earlier decisions, so either outcome is right here; the report must say which it was.
    drained = results["modes"]["kvpolicy"]["reload"]["drained"]
    assert all(d["held"] > d["target"] for d in drained.values()), drained
    assert ("drained to the new targets: " in table) == bool(drained)
    assert ("no pool was left above its new target" in table) == (not drained)
    for mode in ("static", "kvpolicy"):
        for name, t in results["modes"][mode]["tenants"].items():
            slo = t["slo"]
            assert slo["met"] + slo["missed"] == t["completed"] + t["abandoned"], (mode, name, slo)
            assert len(t["ttft_s"]) >= t["completed"]  # every completed request had a first token
            # small.toml checks finished requests after the step: their check is counted apart from its time.
            assert t["check_between_steps"] and t["step_ms_p99_with_check"] >= t["step_ms_p99"]
            assert t["tail"]["steps"] >= 1 and t["tail"]["step_ms"] >= t["step_ms_p99"]
    assert "where the slowest 1% of steps went" in table and "ran after the step, apart from its time" in table
    # Both modes ran here, and the report says on which machine.
    assert results["one_machine"] == f"host {platform.node()}"
    assert f"Every mode ran on host {platform.node()}." in table
    # A kvpolicy-old record beside them (here the same run copied: --combine only reads it) adds its ratios.
    (out / "kvpolicy-old.json").write_text((out / "kvpolicy.json").read_text())
    _run("--combine", str(out))
    again = json.loads((out / "results.json").read_text())
    assert again["ratios_old"]["tokens"] == pytest.approx(again["ratios"]["tokens"])
    assert "| kvpolicy-old |" in (out / "results.md").read_text()
    _refuses_modes_from_two_machines(out)
    try:
        import matplotlib  # noqa: F401 - only whether it imports
    except ImportError:
        assert not (out / "memory.png").exists()  # the plot is optional; the figures are not
    else:
        assert (out / "memory.png").stat().st_size > 10_000
    # results.md links the plot only where one was drawn
    assert ("](memory.png)" in (out / "results.md").read_text()) == (out / "memory.png").exists()


def _refuses_modes_from_two_machines(out: Path) -> None:
    """A record from another machine is refused, and results.json is left as the last good combine wrote it."""
    before = (out / "results.json").read_text()
    other = json.loads((out / "kvpolicy-old.json").read_text())
    other["machine"] = {**other["machine"], "gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-0000"}
    (out / "kvpolicy-old.json").write_text(json.dumps(other))
    proc = _run("--combine", str(out), status=1)
    assert f"static on host {platform.node()}" in proc.stderr and "kvpolicy-old on GPU-0000" in proc.stderr, proc.stderr
    assert (out / "results.json").read_text() == before


@pytest.mark.sglang
def test_the_v4_tenant_builds_a_real_sglang_pool_into_the_ledger(tmp_path: Path) -> None:
    """dsv4.py's SGLang path (the one the H200 run takes), on SGLang's CPU path: the adapter admits the
    policy's reserve in the shared-memory ledger and reports the pool it measured."""
    pytest.importorskip("sglang", reason="needs sglang 0.5.23 (requirements/sglang-cpu.txt)")
    import kvpolicy

    params = load_params(SMALL)
    toml = SMALL.read_text().replace('build = "plan"', 'build = "sglang"').replace(
        'policy = "policy-small.kvp"', f'policy = "{params.policy}"')
    (tmp_path / "v4.toml").write_text(toml)
    ledger = tmp_path / "ledger"
    # No controller and no GPU to measure: another instance gives the GPU's provisional figures.
    figures = kvpolicy.attach(model="figures", gpu="cuda:0", ledger_dir=ledger, capacity=1 << 30, headroom=0, other_used=0)
    try:
        proc = subprocess.Popen(
            [sys.executable, str(BENCH / "dsv4.py"), "--params", str(tmp_path / "v4.toml"), "--policy", str(params.policy),
             "--ledger-dir", str(ledger), "--capacity", str(1 << 30), "--out", str(tmp_path / "v4.json"), "--sglang-on-cpu"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        _, err = proc.communicate("stop\n", timeout=300)
        assert proc.returncode == 0, err[-4000:]
    finally:
        figures.detach()
    built = json.loads((tmp_path / "v4.json").read_text())
    assert built["build"] == "sglang" and built["sglang"] == "0.5.23", built.get("note")
    assert built["reserve"] == 64 << 20 and built["admitted"] == built["reserve"]
    assert built["ledger_runtime_reserved"] == sum(p["bytes"] for p in built["pools"].values()) <= built["reserve"]
    assert set(built["pools"]) >= {"swa", "c4", "c128", "indexer", "compressor_state"}
    assert built["tensor_bytes"] == built["plan"]["tensor_bytes"]  # the closed forms match the real pool
    assert built["cross_check_ok"]
