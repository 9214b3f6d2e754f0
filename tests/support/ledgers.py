"""The real shared-memory ledger in a test's directory, as the adapters meet it.

``SharedLedger(root, unreserved)`` creates the ledger under ``root`` and publishes, as a
controller would, figures that leave each GPU named exactly ``unreserved[gpu]`` bytes to
admit (the capacity, no headroom, no other use: C − H − U, docs/ledger.md). Published
figures win over an engine's own measurement, so the same figures hold on a GPU machine.

- ``connect``: SGLang's connector on it (the adapter's own ``default_connector``);
- ``vllm()``: the vLLM adapter's ``RankSessions`` on it (its ``VllmLedger``);
- ``admitted``, ``reports``, ``held``, ``unreserved``: the ledger read back, per GPU.

Admissions, refusals and their messages are the runtime's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kvpolicy.adapters.settings import AdapterEnv
from kvpolicy.adapters.sglang_dsv4.ports import Connector, default_connector
from kvpolicy.adapters.vllm_adapter.ledger import RankSessions
from kvpolicy.facts import PoolFacts
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.values import GpuLimits, SlotView


class SharedLedger:
    def __init__(self, root: Path, unreserved: Mapping[str, int]) -> None:
        self.root = root
        self.env = AdapterEnv(enabled=True, policy=None, model=None, ledger_dir=root)
        self.dir = LedgerDir(root, create=True)
        for gpu in unreserved:
            self.dir.gpu(gpu, create=True)
        figures = {gpu: GpuLimits(capacity=n, headroom=0, other_used=0, elastic_budget=n) for gpu, n in unreserved.items()}
        self.dir.publish(self.dir.read(), 1, figures, {})
        self.connect: Connector = default_connector(self.env)

    def vllm(self) -> RankSessions:
        return RankSessions(self.env)

    def instances(self, gpu: str) -> list[SlotView]:
        return [v for v in self.dir.read().instances() if v.gpu == gpu]

    def admitted(self, gpu: str) -> dict[str, int]:
        """Per instance on ``gpu``, its static admission (none once it reported its pools)."""
        return {v.id: v.static_admitted for v in self.instances(gpu) if v.static_admitted and not v.pools}

    def reports(self, gpu: str) -> dict[str, dict[str, PoolFacts]]:
        """Per instance on ``gpu`` that reported its pools, what it reported."""
        return {v.id: v.pools for v in self.instances(gpu) if v.pools}

    def held(self, gpu: str) -> int:
        """Runtime-owned bytes reserved on ``gpu``: admissions and reported pools."""
        return sum(v.runtime_reserved for v in self.instances(gpu))

    def unreserved(self, gpu: str) -> int:
        """What a new instance's admission on ``gpu`` may still have: C − H − U − R − G."""
        state = self.dir.read().gpus[gpu]
        f = state.figures
        return f.capacity - f.headroom - f.other_used - state.totals.runtime_reserved - state.totals.guarantees

    def close(self) -> None:
        self.dir.close()
