"""The elastic allocator: CUDA virtual memory mapped chunk by chunk under a limit.

``driver`` (cuda-python, or ``host`` simulation; ``drivers.open_driver`` picks one) →
``arena`` (one VA reservation, chunks mapped on demand, a handle pool) → ``mapping`` (a
pool's arenas mapped chunk by chunk under a ``limits.LimitSource``; no block ids) →
``blocks`` (``BlockPool``: KV block ids over a mapping, with ``free_blocks``' index and
``giveback``'s policy) → ``tensors`` (zero-copy torch views). ``layout.ChunkGrid`` is
where blocks fall on chunks; an engine that hands out its own ids uses a
``ChunkMapping`` with ``live.LiveBlocks`` and a ``GiveBack`` instead of a
``BlockPool``. Nothing here imports torch or cuda-python until it is used.
"""

from kvpolicy.alloc.arena import Arena, MapResult
from kvpolicy.alloc.blocks import BlockPool, PoolStats
from kvpolicy.alloc.counters import CallCounts
from kvpolicy.alloc.driver import CudaDriver, Driver
from kvpolicy.alloc.drivers import open_driver
from kvpolicy.alloc.errors import (
    AllocError,
    BlockError,
    DeviceOutOfMemory,
    DriverError,
    DriverUnavailable,
    OutOfBlocks,
)
from kvpolicy.alloc.giveback import GiveBack, groups_within
from kvpolicy.alloc.host import HostDriver
from kvpolicy.alloc.layout import BlockSpec, ChunkGrid, KVCacheLayout
from kvpolicy.alloc.limits import LimitReading, LimitSource, StaticLimit
from kvpolicy.alloc.live import LiveBlocks
from kvpolicy.alloc.mapping import ChunkMapping

__all__ = [
    "AllocError",
    "Arena",
    "BlockError",
    "BlockPool",
    "BlockSpec",
    "CallCounts",
    "ChunkGrid",
    "ChunkMapping",
    "CudaDriver",
    "DeviceOutOfMemory",
    "Driver",
    "DriverError",
    "DriverUnavailable",
    "GiveBack",
    "HostDriver",
    "KVCacheLayout",
    "LimitReading",
    "LimitSource",
    "LiveBlocks",
    "MapResult",
    "OutOfBlocks",
    "PoolStats",
    "StaticLimit",
    "groups_within",
    "open_driver",
]
