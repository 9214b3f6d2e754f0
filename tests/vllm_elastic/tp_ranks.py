"""The ranks of a tensor-parallel elastic vLLM engine as real processes, and the engine core over them.

Each rank is a spawned process (not forked) holding what a vLLM worker holds: its own
shared-memory ledger instance on its own GPU id, the host driver, an ``ElasticKVBuffer``
with vLLM 0.33's real ``allocate_kv_cache`` views over it, and the adapter's
``RankMapper``. The core is this process: vLLM's real ``KVCacheManager``/``BlockPool``
made elastic over the books of the ranks (``group.group_buffer``), calling the ranks
through one pipe each (``PipeCollective``: every rank gets the request, then every answer
is read; a rank whose pipe closes — killed — fails the call, as vLLM's ``collective_rpc``
fails when a worker dies).

A rank also answers ``audit``: the chunks its driver really has accessible in every layer
region, and its ledger slot's mapped and pending bytes, so tests compare what the core
believes with what each rank's device and ledger hold.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kvpolicy.adapters.vllm_adapter.elastic.wire import RankAnswer, RankRequest
from kvpolicy.units import GiB, MiB

SPAWN = multiprocessing.get_context("spawn")
CHUNK = 2 * MiB
CAPACITY = 8 * GiB


@dataclass(frozen=True)
class RankSpec:
    engine: str
    rank: int
    gpu: str
    ledger_dir: str
    cfg: Any
    """vLLM's ``KVCacheConfig`` (planned once in the parent, pickled)."""
    guarantee: int = 0
    capacity: int = CAPACITY
    grow_chunks: int = 1


def rank_main(conn: Connection, spec: RankSpec) -> None:
    """One rank: attach, build the buffer and vLLM's views, then answer the core until told to close."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from tests.vllm_elastic.elastic_harness import allocate_views, make_buffer

    from kvpolicy.adapters.vllm_adapter.elastic.layouts import BufferGeometry
    from kvpolicy.adapters.vllm_adapter.elastic.rank import RankMapper
    from kvpolicy.alloc import HostDriver
    from kvpolicy.runtime.client import attach

    inst = attach(
        id=f"{spec.engine}/{spec.rank}", model="qwen3-8b", gpu=spec.gpu, engine="vllm", rank=spec.rank,
        engine_id=spec.engine, guarantee=spec.guarantee, elastic=True, capacity=spec.capacity, headroom=0,
        other_used=0, ledger_dir=spec.ledger_dir, handle_signals=False,
    )
    geometry = BufferGeometry.of(spec.cfg, spec.cfg.kv_cache_layout or "BLHNC")
    pinned = geometry.pinned_chunks(CHUNK) * CHUNK
    inst.admit_static(pinned)
    driver = HostDriver(capacity=spec.cfg.num_blocks * geometry.bytes_per_block + pinned + CHUNK * geometry.regions)
    buffer = make_buffer(spec.cfg, driver, CHUNK, inst.limit_source(), spec.grow_chunks)
    views = allocate_views(spec.cfg, buffer, "cpu")
    mapper = RankMapper(buffer, rank=spec.rank, gpu=spec.gpu, block_stride=geometry.block_stride)
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "rank":
            conn.send(mapper.handle(RankRequest.model_validate(message[1])).model_dump())
        elif message[0] == "audit":
            mapping = buffer.mapping
            accessible = [
                c for c in range(mapping.num_chunks)
                if all(driver.is_accessible(a.chunk_address(c), CHUNK) for a in mapping.arenas)
            ]
            slot = inst.snapshot()
            conn.send({"accessible": accessible, "mapped": slot.mapped, "pending": slot.pending,
                       "elastic_held": buffer.limit.elastic_held, "views": len(views)})
        elif message[0] == "close":
            buffer.close()
            inst.detach()
            conn.send("closed")
            return


class PipeCollective:
    """The core's collective over the ranks' pipes: the same request to every rank, every answer back."""

    def __init__(self, conns: Sequence[Connection]) -> None:
        self.conns = list(conns)

    def __call__(self, request: RankRequest) -> list[RankAnswer]:
        errors: list[BaseException] = []
        sent = []
        for conn in self.conns:
            try:
                conn.send(("rank", request.model_dump()))
                sent.append(conn)
            except OSError as exc:
                errors.append(exc)
        answers = []
        for conn in sent:  # read every answer that comes, so the live ranks' pipes stay in step
            try:
                answers.append(RankAnswer.model_validate(conn.recv()))
            except (EOFError, OSError) as exc:
                errors.append(exc)
        if errors:
            raise ConnectionError(f"{len(errors)} rank(s) did not answer: {errors[0]!r}")
        return answers


@dataclass
class Ranks:
    """An engine's rank processes and the pipes to them."""

    engine: str
    gpus: list[str]
    procs: list[Any] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)

    def audit(self, rank: int) -> dict[str, Any]:
        self.conns[rank].send(("audit",))
        return self.conns[rank].recv()

    def kill(self, rank: int) -> None:
        proc = self.procs[rank]
        os.kill(proc.pid, 9)
        proc.join()

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(("close",))
                    conn.recv()
                except (EOFError, OSError):
                    pass
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()


def start_ranks(engine: str, gpus: Sequence[str], ledger_dir: Path, cfg: Any, **options: Any) -> Ranks:
    """Spawn one rank per GPU (rank ``r`` on ``gpus[r]``) and wait until each has built its buffer."""
    ranks = Ranks(engine, list(gpus))
    for r, gpu in enumerate(gpus):
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=rank_main, args=(child, RankSpec(engine, r, gpu, str(ledger_dir), cfg, **options)),
                             daemon=True)
        proc.start()
        child.close()  # only the rank holds its end: its death closes the pipe
        ranks.procs.append(proc)
        ranks.conns.append(parent)
    for conn in ranks.conns:
        assert conn.recv() == "ready"
    return ranks


def core(ranks: Ranks, cfg: Any, max_model_len: int = 1024) -> tuple[Any, Any, Any]:
    """The engine core over ``ranks``: vLLM's KVCacheManager, its BlockPool elastic over the books."""
    from tests.vllm_elastic.elastic_harness import make_manager

    from kvpolicy.adapters.vllm_adapter.elastic.group import group_buffer
    from kvpolicy.adapters.vllm_adapter.elastic.pool import bind_scheduler

    books = group_buffer(PipeCollective(ranks.conns), len(ranks.gpus), refresh_interval=0.0)
    manager = make_manager(cfg, max_model_len)
    pool = bind_scheduler(manager, books, give_back_interval=0.0, report_interval=0.0)
    return manager, pool, books
