"""Zero-copy torch views over the pool: engine shapes, shared bytes, data that survives grow and shrink."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.alloc.alloc_support import close_driver, make_driver, resources

from kvpolicy.alloc import BlockPool, BlockSpec, KVCacheLayout, StaticLimit
from kvpolicy.units import GiB, MiB

torch = pytest.importorskip("torch")
from kvpolicy.alloc.tensors import arena_bytes, block_bytes, kv_view, kv_views  # noqa: E402 - after the skip when torch is missing

CHUNK = 2 * MiB


@pytest.fixture(params=["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def tensor_driver(request: pytest.FixtureRequest) -> Iterator:
    """Host memory (CPU tensors) or the real GPU (CUDA tensors); the simulated bindings make no tensors."""
    d = make_driver(request.param)
    before = resources(d)
    yield d
    leaked = resources(d)
    close_driver(d)
    assert leaked == before


def make(driver, layout, num_blocks):
    return BlockPool(driver, layout, num_blocks, chunk=CHUNK, limit=StaticLimit(1 * GiB))


def sync(driver):
    if driver.kind == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("order", ["layer_major", "block_major"])
def test_views_have_engine_shapes_and_share_bytes(tensor_driver, order):
    layout = KVCacheLayout(num_layers=3, block_size=16, num_heads=4, head_dim=64, dtype="bfloat16", order=order)
    with make(tensor_driver, layout, 256) as pool:
        views = kv_views(pool)  # made before anything is mapped: the address never moves
        k = views[1]["k"]
        assert k.shape == (256, 16, 4, 64) and k.dtype == torch.bfloat16
        assert k.device.type == ("cuda" if tensor_driver.kind == "cuda" else "cpu")
        if order == "layer_major":
            assert k.is_contiguous() and len(pool.arenas) == 6
        else:
            assert k.stride() == (layout.block_stride // 2, 256, 64, 1) and len(pool.arenas) == 1
        ids = pool.alloc(10)
        idx = torch.tensor(ids, device=k.device)
        for layer, parts in enumerate(views):
            for j, part in enumerate(layout.parts):
                parts[part][idx] = float(10 * layer + j + 1)
        sync(tensor_driver)
        again = kv_views(pool)  # a second set of views sees the same memory
        for layer in range(3):
            for j, part in enumerate(layout.parts):
                assert torch.all(again[layer][part][idx] == 10 * layer + j + 1)
        arena, offset = layout.placement(2, "v")
        rows = block_bytes(pool, arena)
        raw = rows[idx, offset : offset + layout.page_bytes]  # (a copy: advanced indexing)
        expected = torch.full((10, layout.page_bytes // 2), 22.0, dtype=torch.bfloat16, device=k.device)
        assert torch.equal(raw.view(torch.bfloat16), expected)
        rows[ids[0], offset : offset + 2].view(torch.bfloat16)[0] = -1.0  # writes through the byte view show too
        sync(tensor_driver)
        assert again[2]["v"][ids[0], 0, 0, 0].item() == -1.0
        del views, again, raw, rows, k, idx


@pytest.mark.parametrize(
    "layout",
    [
        KVCacheLayout(num_layers=4, block_size=16, num_heads=2, head_dim=128, dtype="float16"),
        # DeepSeek-style latent rows of 656 bytes: 41,984-byte pages straddle 2 MiB chunks
        KVCacheLayout(num_layers=2, block_size=64, num_heads=1, head_dim=656, dtype="uint8", latent=True),
    ],
    ids=["mha", "mla-straddling"],
)
def test_data_survives_growth_and_shrinking_of_other_chunks(tensor_driver, layout):
    base = resources(tensor_driver)
    with make(tensor_driver, layout, 2048) as pool:
        views = kv_views(pool)
        keep = pool.alloc(150)
        dev = views[0][layout.parts[0]].device
        patterns = {}
        for layer in range(layout.num_layers):
            for part in layout.parts:
                v = views[layer][part]
                pattern = torch.randint(0, 100, (len(keep), *v.shape[1:]), device=dev).to(v.dtype)
                v[torch.tensor(keep, device=dev)] = pattern
                patterns[layer, part] = pattern
        for _ in range(3):  # churn: grow into new chunks, write there, free them, give them back
            other = pool.alloc(400)
            for layer in range(layout.num_layers):
                for part in layout.parts:
                    views[layer][part][torch.tensor(other, device=dev)] = 7
            sync(tensor_driver)
            pool.free(other)
            assert pool.shrink(0) > 0
        sync(tensor_driver)
        for (layer, part), pattern in patterns.items():
            assert torch.equal(views[layer][part][torch.tensor(keep, device=dev)], pattern)
        del views
    assert resources(tensor_driver) == base


def test_byte_views_cover_the_whole_reservation(tensor_driver):
    with make(tensor_driver, BlockSpec(CHUNK // 8, 2), 64) as pool:
        whole = arena_bytes(pool.arenas[1])
        assert whole.numel() == pool.arenas[1].capacity and whole.data_ptr() == pool.arenas[1].va
        rows = block_bytes(pool, 1)
        assert rows.shape == (64, CHUNK // 8) and rows.data_ptr() == pool.arenas[1].va
        ids = pool.alloc(3)
        rows[ids[1]] = 42
        sync(tensor_driver)
        lo = ids[1] * (CHUNK // 8)
        assert int(whole[lo : lo + CHUNK // 8].sum().item()) == 42 * (CHUNK // 8)
        with pytest.raises(TypeError, match="no KV layout"):
            kv_view(pool, 0)
        del whole, rows


def test_views_keep_their_arena_alive_until_dropped(tensor_driver):
    import gc

    from kvpolicy.alloc import tensors

    layout = KVCacheLayout(num_layers=1, block_size=16, num_heads=1, head_dim=64, dtype="float32")
    with make(tensor_driver, layout, 32) as pool:
        gc.collect()
        before = len(tensors._exported)
        v = kv_view(pool, 0, "v")
        assert len(tensors._exported) == before + 1
        del v
        gc.collect()
        assert len(tensors._exported) == before  # torch called the DLPack deleter
