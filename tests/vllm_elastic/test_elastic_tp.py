"""Elastic vLLM KV cache with tensor parallel > 1: the engine core's pool over ranks in real processes.

Each rank is a spawned process with its own shared-memory ledger instance on its own GPU
id, the host driver and vLLM 0.33's real ``allocate_kv_cache`` views over its buffer; the
core (this process) runs vLLM's real ``KVCacheManager``/``BlockPool`` made elastic over the
books of the ranks (``tests/vllm_elastic/tp_ranks.py``). After every step each rank's
driver, each rank's ledger slot and the core's books must agree: a block is handed out
only when its chunks are mapped on every rank, and a growth one rank refuses leaves
nothing mapped anywhere.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_elastic.elastic_harness import kv_cache_config, make_request
from tests.vllm_elastic.tp_ranks import CAPACITY, Ranks, core, start_ranks

from kvpolicy.units import GiB, MiB

pytestmark = pytest.mark.vllm

BLOCK = 16
MAX_LEN = 1024
ROUND_BUDGET_S = 10.0
"""How long the concurrency test runs its rounds (up to 1,000 per engine); never a pass condition."""


@pytest.fixture(scope="module")
def cfg() -> Any:
    """vLLM's plan for one rank of Qwen3-8B (BLHNC, 2.25 MiB blocks) with 256 MiB: 113 blocks."""
    return kv_cache_config("qwen3-8b", BLOCK, 256 * MiB, MAX_LEN, "BLHNC")


def gpus(n: int) -> list[str]:
    return [f"cuda:{i}" for i in range(n)]


def publish(ledger_dir: Path, revision: int, budgets: dict[str, int], limits: dict[str, tuple[int, int]]) -> None:
    """The controller's publish: each GPU's elastic budget, each instance's (limit, target)."""
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.runtime.ledger import GpuLimits, InstanceLimits

    with LedgerDir(ledger_dir) as ld:
        skipped = ld.publish(
            ld.read(), revision, {g: GpuLimits(CAPACITY, 0, 0, b) for g, b in budgets.items()},
            {i: InstanceLimits(limit=lim, target=tgt, guarantee=0) for i, (lim, tgt) in limits.items()},
        )
    assert not skipped


def mapped_in_books(books: Any) -> list[int]:
    m = books.mapping
    return [c for c in range(m.num_chunks) if m.is_mapped(c)]


def check_agree(ranks: Ranks, books: Any, pool: Any) -> None:
    """The core's books, every rank's driver and every rank's ledger slot say the same."""
    pool.check_consistent()  # every block vLLM holds or can hand out lies in a chunk of the books
    want = mapped_in_books(books)
    elastic = books.limit.elastic_held
    for r in range(len(ranks.gpus)):
        a = ranks.audit(r)
        assert a["accessible"] == want, f"rank {r} has chunks {a['accessible']} mapped, the core {want}"
        assert a["mapped"] == a["elastic_held"] == elastic, f"rank {r}'s ledger counts {a['mapped']}, the core {elastic}"
        assert a["pending"] == 0


def admit(manager: Any, rid: str, tokens: int) -> Any:
    """One request's prefill through vLLM's allocate_slots (the scheduler's call); None on a miss."""
    req = make_request(rid, [random.randrange(1, 30000) for _ in range(tokens)], 1, BLOCK)
    computed, num_computed, _ = manager.get_computed_blocks(req)
    new = manager.allocate_slots(req, req.num_tokens - num_computed, num_new_computed_tokens=num_computed,
                                 new_computed_blocks=computed, full_sequence_must_fit=False)
    return req if new is not None else None


@pytest.mark.parametrize("tp", [2, 4])
def test_every_rank_maps_the_same_chunks_as_the_pool_grows_and_shrinks(cfg: Any, ledger_dir: Path, tp: int) -> None:
    ranks = start_ranks("tp", gpus(tp), ledger_dir, cfg)
    try:
        ids = [f"tp/{r}" for r in range(tp)]
        publish(ledger_dir, 1, dict.fromkeys(gpus(tp), 1 * GiB), dict.fromkeys(ids, (96 * MiB, 96 * MiB)))
        manager, pool, books = core(ranks, cfg)
        check_agree(ranks, books, pool)
        running = []
        for i in range(12):  # prefills of 100-300 tokens (7-19 blocks), until the 96 MiB limit misses
            req = admit(manager, f"r{i}", 100 + 17 * i)
            if req is not None:
                running.append(req)
            pool.on_step(active=True)
            check_agree(ranks, books, pool)
        assert pool.grown_blocks > 0 and pool.refusals["limit"] >= 1
        assert 64 * MiB < books.limit.elastic_held <= 96 * MiB
        handed = {b for req in running for b in manager.get_block_ids(req.request_id)[0]}
        on_every_rank = set(ranks.audit(0)["accessible"])
        assert {c for b in handed for c in books.grid.chunks_of(b)} <= on_every_rank
        for req in running:
            manager.free(req)
        publish(ledger_dir, 2, dict.fromkeys(gpus(tp), 1 * GiB), dict.fromkeys(ids, (8 * MiB, 0)))
        pool.on_step(active=False)  # the lower limit: every rank synchronises and unmaps the same chunks
        check_agree(ranks, books, pool)
        assert books.limit.elastic_held <= 8 * MiB and pool.unmapped_chunks > 0
        acked = [ranks.audit(r) for r in range(tp)]  # the acknowledgement rides on the next call
        assert all(a["mapped"] <= 8 * MiB for a in acked)
    finally:
        ranks.close()


def test_a_refusal_on_one_rank_refuses_every_rank_and_leaves_nothing_mapped(cfg: Any, ledger_dir: Path) -> None:
    """TP=4 whose last GPU's elastic budget is the smallest: a growth it refuses is undone on the three others."""
    ranks = start_ranks("tp", gpus(4), ledger_dir, cfg)
    try:
        ids = [f"tp/{r}" for r in range(4)]
        budgets = dict.fromkeys(gpus(4), 1 * GiB) | {"cuda:3": 16 * MiB}
        publish(ledger_dir, 1, budgets, dict.fromkeys(ids, (128 * MiB, 128 * MiB)))
        _, pool, books = core(ranks, cfg)
        assert pool.make_room(4)  # 10 MiB: every GPU's budget allows it
        check_agree(ranks, books, pool)
        before = mapped_in_books(books)
        assert not pool.make_room(20)  # 45 MiB: the limits allow it, cuda:3's budget does not
        assert pool.refusals["admission"] == 1
        assert "rank 3 on cuda:3 refused" in str(pool.last_refusal)
        assert mapped_in_books(books) == before
        check_agree(ranks, books, pool)  # ranks 0-2 mapped the chunks and unmapped them again
        assert pool.vllm.get_num_free_blocks() == 4
    finally:
        ranks.close()


def test_kill_9_of_a_rank_releases_its_claim_and_the_engine_stops_growing(cfg: Any, ledger_dir: Path) -> None:
    from kvpolicy.runtime.directory import LedgerDir
    from kvpolicy.adapters.vllm_adapter.elastic.group import ranks_of
    from kvpolicy.runtime.ledger import GpuLedger

    ranks = start_ranks("tp", gpus(2), ledger_dir, cfg)
    try:
        publish(ledger_dir, 1, dict.fromkeys(gpus(2), 1 * GiB), {"tp/0": (64 * MiB, 64 * MiB), "tp/1": (64 * MiB, 64 * MiB)})
        _, pool, books = core(ranks, cfg)
        assert pool.make_room(8)
        check_agree(ranks, books, pool)
        held, before = books.limit.elastic_held, mapped_in_books(books)
        ranks.kill(1)
        group = ranks_of(books)
        assert group is not None
        calls = group.calls
        assert not pool.make_room(16)  # the collective (the limits' sync before growing) fails: broken
        assert group.broken is not None and "did not answer" in group.broken
        assert pool.refusals["ranks"] == 1 and mapped_in_books(books) == before
        pool.on_step(active=True)
        assert not pool.make_room(16)
        assert pool.refusals["ranks"] == 2 and group.calls == calls + 1  # refused at once, no call made
        pool.on_step(active=False)  # between steps as usual: no call to the ranks, no error
        pool.check_consistent()
        survivor = ranks.audit(0)
        assert survivor["mapped"] == held  # the survivor's mapped bytes stay counted
        with LedgerDir(ledger_dir) as ld:  # the controller's tick (or the next attach on that GPU)
            gone = ld.reclaim_dead()
        assert [v.id for v in gone] == ["tp/1"]
        led = GpuLedger.open(ledger_dir, "cuda:1", create=False)
        try:
            views, _ = led.slots()
            assert views == [] and led.totals().elastic_committed == 0
        finally:
            led.close()
    finally:
        ranks.close()


def test_two_tp_engines_growing_concurrently_never_over_admit_nor_deadlock(cfg: Any, ledger_dir: Path) -> None:
    """Two TP=2 engines on the same two GPUs (ranks in opposite GPU order), long-lived rank processes,
    growing and giving back as fast as they can for a time budget (at most 1,000 rounds each): every
    round each engine's ranks agree with its books, and no GPU's ledger ever holds more than its budget."""
    from kvpolicy.runtime.ledger import GpuLedger

    budget = 40 * MiB
    a = start_ranks("a", ["cuda:0", "cuda:1"], ledger_dir, cfg)
    b = start_ranks("b", ["cuda:1", "cuda:0"], ledger_dir, cfg)
    try:
        limits = {f"{e}/{r}": (32 * MiB, 0) for e in "ab" for r in range(2)}
        publish(ledger_dir, 1, dict.fromkeys(gpus(2), budget), limits)
        errors: list[Exception] = []
        rounds = {"a": 0, "b": 0}
        outcomes: dict[str, dict[str, int]] = {"a": {}, "b": {}}
        stop = time.monotonic() + ROUND_BUDGET_S

        def engine(name: str, ranks: Ranks, seed: int) -> None:
            rng = random.Random(seed)
            try:
                _, pool, books = core(ranks, cfg)
                ledgers = [GpuLedger.open(ledger_dir, g, create=False) for g in gpus(2)]
                while rounds[name] < 1000 and (rounds[name] == 0 or time.monotonic() < stop):  # one round at least, however slow
                    n = rng.randrange(1, 15)
                    ok = pool.make_room(n)
                    outcomes[name]["grown" if ok else "refused"] = outcomes[name].get("grown" if ok else "refused", 0) + 1
                    if ok:
                        pool.vllm.free_blocks(pool.vllm.get_new_blocks(n))
                    for led in ledgers:
                        views, _ = led.slots()
                        assert sum(v.mapped + v.pending for v in views) <= budget, "a GPU ledger over-admitted"
                        assert led.totals().elastic_committed <= budget
                    check_agree(ranks, books, pool)
                    pool.on_step(active=True)  # target 0: every free chunk goes back
                    check_agree(ranks, books, pool)
                    rounds[name] += 1
                for led in ledgers:
                    led.close()
            except Exception as exc:  # noqa: BLE001 - any failure of an engine thread is re-raised in the test below
                errors.append(exc)

        threads = [threading.Thread(target=engine, args=(n, r, s)) for n, r, s in (("a", a, 1), ("b", b, 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=ROUND_BUDGET_S + 300)  # a deadlock shows as a thread still waiting
        assert not any(t.is_alive() for t in threads), "an engine's rounds never finished: deadlock"
        if errors:
            raise errors[0]
        assert rounds["a"] >= 1 and rounds["b"] >= 1
        print(f"rounds {rounds}, outcomes {outcomes}")
    finally:
        a.close()
        b.close()
