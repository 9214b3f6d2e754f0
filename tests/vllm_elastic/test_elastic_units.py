"""The elastic vLLM pieces that need no vLLM: policy settings, the allocator additions (grow,
before_unmap, zero fill), and the linter's elastic vocabulary (the pinned limit: tests/alloc/test_alloc_pinned.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.vllm_adapter.elastic.policy import check_parallel, elastic_settings
from kvpolicy.adapters.vllm_adapter.pools import VLLM_ELASTIC_POOLS
from kvpolicy.alloc import BlockPool, BlockSpec, HostDriver, OutOfBlocks, StaticLimit
from kvpolicy.units import GiB, MiB

CHUNK = 2 * MiB


def policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.kvp"
    path.write_text("version 1\n" + text)
    return path


# ------------------------------------------------------------------ policy


def test_elastic_settings_resolve_min_and_max_for_the_gpu(tmp_path: Path) -> None:
    p = policy(tmp_path, 'defaults { chunk 4 MiB }\nmodel "qwen3-*" {\n engine vllm\n min 1 GiB\n max 25%\n pool full { owner elastic }\n}\n')
    s = elastic_settings(p, "qwen3-8b", "cuda:0", 80 * GiB)
    assert s is not None
    assert (s.guarantee, s.virtual, s.chunk, s.pools) == (1 * GiB, 20 * GiB, 4 * MiB, ("full",))


def test_no_elastic_pool_means_no_elastic_settings(tmp_path: Path) -> None:
    p = policy(tmp_path, 'model "qwen3-8b" {\n engine vllm\n reserve 4 GiB\n}\n')
    assert elastic_settings(p, "qwen3-8b", "cuda:0", 80 * GiB) is None
    assert elastic_settings(None, "qwen3-8b", "cuda:0", 80 * GiB) is None


def test_max_is_capped_at_the_gpu_and_rounded_to_chunks(tmp_path: Path) -> None:
    p = policy(tmp_path, 'gpu * { capacity 10 GiB }\nmodel "m" {\n max 12 GiB\n min 3 MiB\n pool full { owner elastic }\n}\n')
    s = elastic_settings(p, "m", "cuda:0", None)
    assert s is not None and s.virtual == 10 * GiB and s.guarantee == 2 * MiB


@pytest.mark.parametrize("pool", ["swa", "c4", "indexer", "mamba"])
def test_pools_that_cannot_be_elastic_are_refused(tmp_path: Path, pool: str) -> None:
    p = policy(tmp_path, f'model "m" {{\n engine vllm\n pool {pool} {{ owner elastic }}\n}}\n')
    # The policy loader refuses it (KV013, an error); the adapter checks again for policies it did not load.
    with pytest.raises(AdapterError, match=f"KV013 error: the vllm adapter cannot run pool '{pool}' elastically"):
        elastic_settings(p, "m", "cuda:0", 80 * GiB)


def test_percentages_need_a_capacity(tmp_path: Path) -> None:
    p = policy(tmp_path, 'model "m" {\n max 50%\n pool full { owner elastic }\n}\n')
    with pytest.raises(AdapterError, match="capacity of cuda:0 is unknown"):
        elastic_settings(p, "m", "cuda:0", None)


def test_min_above_max_on_this_gpu_is_refused(tmp_path: Path) -> None:
    p = policy(tmp_path, 'model "m" {\n min 50%\n max 8 GiB\n pool full { owner elastic }\n}\n')
    with pytest.raises(AdapterError, match="`min` 40 GiB is above its `max` 8 GiB on cuda:0"):
        elastic_settings(p, "m", "cuda:0", 80 * GiB)


@pytest.mark.parametrize(
    ("world", "backend", "dp", "pp", "ok"),
    [
        (1, "uni", 1, 1, True), (1, "external_launcher", 1, 1, True), (2, "mp", 1, 1, True), (4, "mp", 1, 1, True),
        (1, "mp", 1, 1, True), (1, "uni", 2, 1, False), (2, "uni", 1, 1, False), (4, "mp", 1, 2, False),
        (2, "mp", 2, 1, False), (2, "ray", 1, 1, False),
    ],
)
def test_one_engine_core_over_its_tensor_parallel_ranks_can_be_elastic(
    world: int, backend: str, dp: int, pp: int, ok: bool
) -> None:
    if ok:
        check_parallel(world, backend, dp, pp)
    else:
        with pytest.raises(AdapterError, match="tensor parallel ranks of one engine core"):
            check_parallel(world, backend, dp, pp)


# ------------------------------------------------------------------ allocator additions


def test_grow_returns_new_free_ids_and_never_applies_a_new_revision() -> None:
    limit = StaticLimit(8 * CHUNK)
    driver = HostDriver(capacity=1 * GiB)
    pool = BlockPool(driver, BlockSpec(CHUNK * 3 // 4), 32, chunk=CHUNK, limit=limit)  # blocks straddle chunks
    try:
        ids = pool.grow(3)
        assert ids == sorted(ids) and len(ids) >= 3 and not any(pool.is_live(b) for b in ids)
        assert all(pool.is_chunk_mapped(c) for b in ids for c in pool.chunks_of_block(b))
        held = pool.held_bytes
        limit.set(2 * CHUNK)
        with pytest.raises(OutOfBlocks) as err:
            pool.grow(1)
        assert err.value.reason == "revision" and pool.held_bytes == held  # nothing released here
        pool.sync()  # the caller applies it where it chooses
        assert pool.held_bytes <= 2 * CHUNK and limit.acked == (2, "applied")
        assert pool.grow(0) == []
    finally:
        pool.close()
        driver.close()


def test_before_unmap_sees_every_chunk_first_and_can_stop_it() -> None:
    limit = StaticLimit(8 * CHUNK)
    driver = HostDriver(capacity=1 * GiB)
    calls: list[list[int]] = []
    stop = {"now": False}

    def before(chunks: list[int]) -> None:
        calls.append(chunks)
        if stop["now"]:
            raise RuntimeError("not now")

    pool = BlockPool(driver, BlockSpec(CHUNK // 2), 32, chunk=CHUNK, limit=limit, before_unmap=before)
    try:
        pool.grow(8)  # 4 chunks
        stop["now"] = True
        with pytest.raises(RuntimeError, match="not now"):
            pool.shrink(0)
        assert pool.held_bytes == 4 * CHUNK and calls == [[3, 2, 1, 0]]  # nothing was unmapped
        stop["now"] = False
        pool.shrink(CHUNK)
        assert calls[-1] == [3, 2, 1] and pool.held_bytes == CHUNK
    finally:
        pool.close()
        driver.close()


def test_new_chunks_are_zeroed_before_their_blocks_are_handed_out() -> None:
    limit = StaticLimit(8 * CHUNK)
    driver = HostDriver(capacity=1 * GiB)
    pool = BlockPool(driver, BlockSpec(CHUNK), 8, chunk=CHUNK, limit=limit, zero_new_chunks=True)
    try:
        va = pool.arenas[0].va
        pool.grow(2)
        driver.write(va, b"\xff" * 64)
        pool.shrink(0)
        # The same physical memory may come back; zeroing is what makes it read zero.
        driver.inject("cuMemsetD8Async", "CUDA_ERROR_INVALID_VALUE")
        with pytest.raises(Exception, match="cuMemsetD8Async"):
            pool.grow(1)
        assert pool.held_bytes == 0 and limit.mapped == 0 and limit.pending == 0  # the failed grow was undone
        pool.grow(1)
        assert driver.read(va, 64) == bytes(64)
        assert pool.arenas[0].calls.zero >= 2
    finally:
        pool.close()
        driver.close()


# ------------------------------------------------------------------ lint


def lint(tmp_path: Path, text: str) -> list[tuple[str, int, str]]:
    from kvpolicy.lint.engine import lint_file

    path = policy(tmp_path, text)
    return [(d.code, d.line, d.message) for d in lint_file(path).diagnostics]


def test_lint_accepts_elastic_standard_pools_on_vllm(tmp_path: Path) -> None:
    for pool in VLLM_ELASTIC_POOLS:
        found = lint(tmp_path, f'model "m" {{\n engine vllm\n min 2 GiB\n max 40%\n weight 10\n pool {pool} {{ owner elastic }}\n}}\n')
        assert [c for c, _, _ in found if c in ("KV013", "KV022")] == [], found


def test_lint_keeps_deepseek_v4_pools_runtime_owned_on_vllm(tmp_path: Path) -> None:
    found = lint(tmp_path, 'model "deepseek-v4-flash" {\n engine vllm\n pool swa { owner elastic }\n}\n')
    assert ("KV013", 4, "the vllm adapter cannot run pool 'swa' elastically") in found


def test_lint_warns_min_on_vllm_without_an_elastic_pool(tmp_path: Path) -> None:
    found = lint(tmp_path, 'model "m" {\n engine vllm\n reserve 4 GiB\n min 2 GiB\n}\n')
    assert ("KV022", 5, "'min' has no effect: no pool of this vllm model is `owner elastic`") in found


def test_lint_still_warns_on_sglang_without_an_elastic_pool(tmp_path: Path) -> None:
    found = lint(tmp_path, 'model "m" {\n engine sglang\n reserve 4 GiB\n weight 3\n}\n')
    assert ("KV022", 5, "'weight' has no effect: no pool of this sglang model is `owner elastic`") in found


def test_rule_docs_keep_their_sections() -> None:
    from kvpolicy.catalogue import DOC_SECTIONS, rule_by_code

    for code in ("KV013", "KV022"):
        rule = rule_by_code(code)
        assert rule is not None and list(rule.sections()) == list(DOC_SECTIONS)
