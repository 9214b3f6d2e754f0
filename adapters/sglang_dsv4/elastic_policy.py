"""What a policy says about a DeepSeek-V4 model's elastic SWA pool, and which launches can have one.

Pure: imports neither torch nor sglang; ``kvpolicy plan`` and the adapter's hooks
both read the policy through it. ``pool swa { owner elastic }`` in the model block
makes the SWA pool elastic; the model's ``min`` is its guarantee and ``max`` (or the
pool's own ``max``, if lower) caps the bytes mapped. Percentages resolve against the
GPU's capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpolicy.units import format_bytes

from ..errors import AdapterError
from .plan import SWAElasticPolicy

if TYPE_CHECKING:
    from kvpolicy.policy.resolve import ModelSettings

ELASTIC_POOL = "swa"


def swa_is_elastic(settings: ModelSettings) -> bool:
    """Whether the model block marks the SWA pool ``owner elastic``."""
    block = settings.pools.get(ELASTIC_POOL)
    owner = getattr(getattr(block, "owner", None), "value", None)
    return owner == "elastic"


def elastic_swa_policy(settings: ModelSettings, *, chunk: int, capacity: int) -> SWAElasticPolicy | None:
    """The elastic SWA pool of ``settings`` on a GPU of ``capacity`` bytes mapped in ``chunk``\\ s, or None
    when the policy keeps the SWA pool runtime-owned."""
    if not swa_is_elastic(settings):
        return None
    maximum = min(settings.max_bytes(capacity), capacity)
    pool_max = settings.pool_max_bytes(ELASTIC_POOL, capacity)
    if pool_max is not None:
        maximum = min(maximum, pool_max)
    guarantee = settings.min_bytes(capacity)
    if guarantee > maximum:
        raise AdapterError(
            f"kvpolicy: {settings.name!r}'s `min` {format_bytes(guarantee)} is above the elastic SWA pool's "
            f"max {format_bytes(maximum)}; fix the policy"
        )
    return SWAElasticPolicy(chunk=chunk, guarantee=guarantee, maximum=maximum)


def check_tensor_parallel(tp_size: int) -> None:
    """An elastic SWA pool runs on one GPU per engine for now: refuse TP > 1 at start, loudly."""
    if tp_size != 1:
        raise AdapterError(
            f"kvpolicy: an elastic DeepSeek-V4 SWA pool needs tensor parallel 1; this engine runs --tp-size "
            f"{tp_size}. Each rank would map its SWA pages on its own while SGLang's scheduler admits requests "
            "for all of them. Run with --tp-size 1, or mark the pool `owner runtime`."
        )
