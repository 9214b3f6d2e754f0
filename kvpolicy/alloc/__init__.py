"""The elastic allocator: CUDA virtual memory mapped chunk by chunk under a limit.

``driver`` (cuda-python, or ``host`` simulation) → ``arena`` (one VA reservation,
chunks mapped on demand, a handle pool) → ``blocks`` (KV block ids over arenas,
growing and shrinking under a ``limits.LimitSource``) → ``tensors`` (zero-copy torch
views). Nothing here imports torch or cuda-python until it is used.
"""

from kvpolicy.alloc.arena import Arena, MapResult
from kvpolicy.alloc.blocks import BlockPool, PoolStats
from kvpolicy.alloc.counters import CallCounts
from kvpolicy.alloc.driver import CudaDriver, Driver, open_driver
from kvpolicy.alloc.errors import (
    AllocError,
    BlockError,
    DeviceOutOfMemory,
    DriverError,
    DriverUnavailable,
    OutOfBlocks,
)
from kvpolicy.alloc.host import HostDriver
from kvpolicy.alloc.layout import BlockSpec, KVCacheLayout
from kvpolicy.alloc.limits import LimitReading, LimitSource, StaticLimit

__all__ = [
    "AllocError",
    "Arena",
    "BlockError",
    "BlockPool",
    "BlockSpec",
    "CallCounts",
    "CudaDriver",
    "DeviceOutOfMemory",
    "Driver",
    "DriverError",
    "DriverUnavailable",
    "HostDriver",
    "KVCacheLayout",
    "LimitReading",
    "LimitSource",
    "MapResult",
    "OutOfBlocks",
    "PoolStats",
    "StaticLimit",
    "open_driver",
]
