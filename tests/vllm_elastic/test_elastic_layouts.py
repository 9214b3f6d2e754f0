"""Which layout an elastic vLLM cache asks for, and where a block lies in it (``elastic.layouts``).

The choice is pure; the geometry is read from vLLM 0.33's own plans (Qwen3-8B, Gemma-3-1B) in
each layout, and the widened config goes through vLLM's own ``allocate_kv_cache`` over the
allocator's one reservation (host driver): each layer's view starts on its own region, and
bytes written through a layer's view of block b land in that region's page of b.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.vllm_adapter.elastic import lifecycle
from kvpolicy.adapters.vllm_adapter.elastic.layouts import ELASTIC_LAYOUTS, BufferGeometry, choose_layout
from kvpolicy.units import MiB

CHUNK = 2 * MiB


@pytest.mark.parametrize(
    "supported, chosen",
    [
        (None, "BLHNC"),  # nothing declared: BLHNC as before
        (["LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC"], "BLHNC"),  # accepted: the cheaper one
        (["LBHNC"], "LBHNC"),  # vLLM's CPU backend
        (["LBNHC"], "LBNHC"),  # FlexAttention
        (["LHBNC", "LBHNC"], "LBHNC"),  # ROCm: its own order, among what can be elastic
        (["LBHNC", "BLNHC"], "BLNHC"),  # block-outermost first
        (["LHBNC"], None),
    ],
)
def test_the_layout_asked_for_is_blhnc_where_accepted(supported: list[str] | None, chosen: str | None) -> None:
    assert choose_layout(supported) == chosen


def elastic_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.kvp"
    path.write_text('version 1\nmodel "m" {\n engine vllm\n max 1 GiB\n pool full { owner elastic }\n}\n')
    return path


class _Config:
    class cache_config:  # vLLM's attribute name
        kv_cache_layout = None


@pytest.mark.parametrize("supported, expected", [([["LBHNC"]], "LBHNC"), ([["LBNHC", "BLHNC"]], "BLHNC")])
def test_the_engine_core_asks_vllm_for_a_layout_its_backends_accept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, supported: list[list[str]], expected: str
) -> None:
    monkeypatch.setenv("KVPOLICY_POLICY", str(elastic_policy(tmp_path)))
    environ: dict[str, str] = {}
    assert lifecycle.prepare_engine(_Config, "m", lambda: supported, environ)
    assert environ == {"VLLM_KV_CACHE_LAYOUT": expected}


def test_backends_that_accept_no_elastic_layout_stop_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOLICY_POLICY", str(elastic_policy(tmp_path)))
    with pytest.raises(AdapterError, match="accept only the KV cache layouts LHBNC"):
        lifecycle.prepare_engine(_Config, "m", lambda: [["LHBNC"]], {})
    with pytest.raises(AdapterError, match="VLLM_KV_CACHE_LAYOUT=LHBNC"):
        lifecycle.prepare_engine(_Config, "m", lambda: [["LBHNC"]], {"VLLM_KV_CACHE_LAYOUT": "LHBNC"})


# ------------------------------------------------------------------ on vLLM's own plans


@pytest.mark.vllm
@pytest.mark.parametrize(
    "name, layout",
    # Gemma-3's mixed page sizes: vLLM itself plans them only block-outermost (validate_kv_cache_layout).
    [("qwen3-8b", layout) for layout in ELASTIC_LAYOUTS] + [("gemma-3-1b", "BLHNC")],
)
def test_geometry_of_vllms_plan_and_its_views_over_the_reservation(name: str, layout: str) -> None:
    pytest.importorskip("vllm")
    import torch
    from tests.vllm_elastic.elastic_harness import allocate_views, kv_cache_config, make_buffer

    from kvpolicy.alloc import HostDriver, StaticLimit

    cfg = kv_cache_config(name, 16, 256 * MiB, 1024, layout)
    geometry = BufferGeometry.of(cfg, layout)
    tensors = cfg.kv_cache_tensors
    assert geometry.bytes_per_block == tensors[0].size // cfg.num_blocks
    if layout.startswith("B"):
        assert geometry.regions == 1 and geometry.block_stride == geometry.bytes_per_block
        assert geometry.widened(cfg, CHUNK) is cfg
    else:
        assert geometry.regions * geometry.block_stride == geometry.bytes_per_block
        widened = geometry.widened(cfg, CHUNK)
        region = geometry.region_bytes(CHUNK)
        assert region % CHUNK == 0 and 0 <= region - cfg.num_blocks * geometry.block_stride < CHUNK
        assert {t.layer_stride for t in widened.kv_cache_tensors} == {region}
        assert {t.size for t in widened.kv_cache_tensors} == {geometry.regions * region}
        assert [t.offset // region for t in widened.kv_cache_tensors] == [t.offset // t.layer_stride for t in tensors]
        assert cfg.kv_cache_tensors[0].layer_stride == cfg.num_blocks * geometry.block_stride  # vLLM's, untouched
    driver = HostDriver(capacity=1 << 30)
    buffer = make_buffer(cfg, driver, CHUNK, StaticLimit(64 * MiB))
    try:
        views = allocate_views(cfg, buffer, "cpu")
        assert buffer.pinned == geometry.pinned_chunks(CHUNK) * CHUNK == driver.in_use
        block = 5
        buffer.mapping.map_missing([block], requested=1, free=0)  # its chunk(s), in every region
        for name_, view in views.items():
            page = view[block]
            page.view(torch.int8).fill_(7)  # through vLLM's own view of this layer, block 5
            ptr = page.data_ptr()
            assert buffer.va <= ptr < buffer.va + buffer.size, name_
            if geometry.regions == 1:
                assert (ptr - buffer.va) // geometry.bytes_per_block == block
            else:
                assert (ptr - buffer.va) % buffer.mapping.region_bytes == block * geometry.block_stride
            assert driver.read(ptr, 16) == b"\x07" * 16
    finally:
        buffer.close()
        driver.close()
