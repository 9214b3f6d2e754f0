"""Zero-copy torch tensors over arenas: the shapes and strides an engine's attention kernels expect.

A view covers the arena's whole virtual capacity, mapped or not, so it is made
once and never moves; an engine touches only blocks it holds, which are mapped.
Writes through one view are visible through every other view of the same bytes —
they are the same memory. Views are invalid once the arena or pool is closed.

Tensors are imported through DLPack (a capsule built here with ctypes) rather than
``__cuda_array_interface__``: torch checks a CUDA array interface pointer with
cudaPointerGetAttributes, which rejects an address whose chunk is not mapped (a
fresh reservation), while a DLPack tensor carries its device explicitly. On the
host driver the same code makes CPU tensors over the simulated device memory.

torch is imported here only, on first use.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from kvpolicy.alloc.arena import Arena
from kvpolicy.alloc.blocks import BlockPool
from kvpolicy.alloc.layout import KVCacheLayout
from kvpolicy.alloc.mapping import ChunkMapping

if TYPE_CHECKING:
    import torch

_KDL_CPU = 1
_KDL_CUDA = 2
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# What each exported tensor keeps alive (its struct, its shape array, its arena),
# keyed by the struct's address until torch calls the deleter.
_exported: dict[int, tuple[Any, ...]] = {}


@_Deleter
def _release_export(managed: Any) -> None:
    try:
        address = ctypes.cast(managed, ctypes.c_void_p).value
        if address is not None:
            _exported.pop(address, None)
    except (AttributeError, TypeError):  # interpreter shutdown: this module's globals are already gone
        return


# torch calls the deleter when a tensor dies, which for an engine's KV views is at
# interpreter shutdown, after module globals are torn down. The callback object must
# outlive them, or torch would call freed memory (a segfault on exit): one reference
# is leaked on purpose.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_release_export))


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _torch() -> Any:
    import torch

    return torch


def arena_bytes(arena: Arena) -> torch.Tensor:
    """A uint8 tensor over the arena's whole reservation (``arena.capacity`` bytes), on its device."""
    if arena.closed:
        raise ValueError(f"arena {arena.name!r} is closed")
    return _bytes_at(arena.driver, arena.va, arena.capacity, arena)


def mapping_bytes(mapping: ChunkMapping) -> torch.Tensor:
    """A uint8 tensor over a contiguous mapping's one reservation (every region, end to end)."""
    if mapping.closed or mapping.va is None:
        raise ValueError(f"mapping {mapping.name!r} is closed or not contiguous")
    return _bytes_at(mapping.driver, mapping.va, mapping.region_bytes * len(mapping.arenas), mapping)


def _bytes_at(driver: Any, va: int, size: int, owner: object) -> torch.Tensor:
    """A uint8 tensor of ``size`` bytes at ``va`` on ``driver``'s device; ``owner`` is kept alive with it."""
    torch = _torch()
    cuda = driver.kind == "cuda"
    shape = (ctypes.c_int64 * 1)(size)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data = va
    t.device = _DLDevice(_KDL_CUDA if cuda else _KDL_CPU, driver.device if cuda else 0)
    t.ndim = 1
    t.dtype = _DLDataType(_KDL_UINT, 8, 1)
    t.shape = shape
    t.strides = None  # contiguous
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    _exported[address] = (managed, shape, owner)
    capsule = _capsule_new(address, b"dltensor", None)
    return torch.utils.dlpack.from_dlpack(capsule)


def block_bytes(pool: BlockPool, arena_index: int = 0) -> torch.Tensor:
    """``[num_blocks, block_stride]`` uint8 view of one arena of ``pool``: row ``b`` is block ``b``'s bytes there."""
    arena = pool.arenas[arena_index]
    raw = arena_bytes(arena)
    return raw.as_strided((pool.num_blocks, pool.block_stride), (pool.block_stride, 1), 0)


def kv_view(pool: BlockPool, layer: int, part: str = "k") -> torch.Tensor:
    """``[num_blocks, block_size, num_heads, head_dim]`` tensor of ``layer``'s ``part`` (k, v or latent).

    Contiguous for a ``layer_major`` layout; for ``block_major`` the block dimension
    strides over every layer's pages (vLLM's per-layer views of one buffer).
    """
    layout = pool.geometry
    if not isinstance(layout, KVCacheLayout):
        raise TypeError(f"pool {pool.name!r} has no KV layout (it was built from {type(layout).__name__})")
    torch = _torch()
    arena_index, offset = layout.placement(layer, part)
    dtype = getattr(torch, layout.dtype)
    item = layout.itemsize
    typed = arena_bytes(pool.arenas[arena_index]).view(dtype)
    hd, nh, bs = layout.head_dim, layout.num_heads, layout.block_size
    return typed.as_strided(
        (pool.num_blocks, bs, nh, hd),
        (layout.block_stride // item, nh * hd, hd, 1),
        offset // item,
    )


def kv_views(pool: BlockPool) -> list[dict[str, torch.Tensor]]:
    """Per layer, ``{"k": ..., "v": ...}`` (or ``{"latent": ...}``) views, as ``kv_view`` makes them."""
    layout = pool.geometry
    if not isinstance(layout, KVCacheLayout):
        raise TypeError(f"pool {pool.name!r} has no KV layout (it was built from {type(layout).__name__})")
    return [{part: kv_view(pool, layer, part) for part in layout.parts} for layer in range(layout.num_layers)]
