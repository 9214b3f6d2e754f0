"""An engine's ranks as a ``RankGroup`` for all-or-none static admission, over the engine's own process group.

Both engines start their ranks with ``torch.distributed`` and keep a CPU (gloo) group
beside the device one; group admission gathers a few small Python values over it, once
per rank at start-up (``kvpolicy.runtime.group``). A dead rank makes gloo's collective
fail, or the process group's timeout end it: the survivors then give their admissions back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpolicy.runtime.session import RankGroup


def process_group_ranks(coordinator: Any) -> RankGroup | None:
    """The ranks of an engine's ``GroupCoordinator`` (vLLM's and SGLang's share the fields used here:
    ``rank_in_group``, ``world_size``, ``cpu_group``); None for a group of one."""
    size = int(coordinator.world_size)
    if size <= 1:
        return None
    cpu_group = coordinator.cpu_group

    def gather(value: Any) -> Sequence[Any]:
        import torch.distributed as dist

        values: list[Any] = [None] * size
        dist.all_gather_object(values, value, group=cpu_group)
        return values

    return RankGroup(rank=int(coordinator.rank_in_group), size=size, gather=gather)


__all__ = ["process_group_ranks"]
