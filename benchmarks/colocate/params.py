"""The benchmark's parameters: one TOML file says the trace, the engine, the KV geometry and the budget.

``default.toml`` is the H200 run of issue 8; ``allbusy.toml``, ``bursty4.toml`` and
``longprompt.toml`` other traces on the same engine, geometry and allocator settings
(they extend ``default.toml``); ``cpu.toml`` the default trace on the host driver with
a geometry scaled down so the same token capacities fit in host memory;
``tests/colocate/small.toml`` the CI configuration. Sizes are strings with units
(``"48 GiB"``); paths are relative to the parameter file.

Guarantees, maxima, weights, the V4 reserve and the idle rule live in the policy file
the parameters name, not here: the policy is what the controller enforces, and the
driver reads the figures it needs (guarantees, the rule's threshold and grace) from it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from clock import ClockKind

from kvpolicy.alloc.layout import KVCacheLayout
from kvpolicy.units import SIZE_UNITS, parse_number, size_bytes


def parse_size(value: object) -> int:
    """``"48 GiB"`` / ``"48GiB"`` / ``1024`` → bytes."""
    if isinstance(value, int):
        return value
    text = str(value).strip().replace(" ", "")
    for unit in sorted(SIZE_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)]:
            return size_bytes(parse_number(text[: -len(unit)]), unit)
    if text.isdigit():
        return int(text)
    raise ValueError(f"not a size: {value!r} (write e.g. \"48 GiB\")")


Size = Annotated[int, BeforeValidator(parse_size)]


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Trace(Strict):
    """Per tenant: Poisson arrivals, fast in the busy phase and slow otherwise."""

    seed: int = 0
    duration_s: float = Field(gt=0)
    busy_rate: float = Field(gt=0, description="arrivals per second in the busy phase")
    idle_rate: float = Field(ge=0, description="arrivals per second outside it")
    busy_s: float = Field(gt=0, description="busy seconds in each period")
    period_s: float = Field(gt=0)
    phase_offset_s: float = Field(ge=0, description="tenant i's busy phase starts at i × offset")
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]


class KV(Strict):
    """Every tenant's KV geometry, and how much of it a decode step's attention reads."""

    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    block_tokens: int = Field(gt=0)
    chunk: Size = 2 << 20
    elastic_chunk: Size | None = Field(
        default=None,
        description="kvpolicy mode: the elastic pools' mapping chunk (None: ``chunk``). Static pools map their share "
        "once at start-up and keep ``chunk``, so the baseline does not change with it",
    )
    attn_layers: int = Field(default=1, ge=0, description="layers a decode step attends over")
    attention: Literal["paged", "gather"] = Field(
        default="gather",
        description="paged: a Triton decode kernel reads the KV in place through the block table (a GPU's way); "
        "gather: copy each request's blocks out, then torch SDPA (the reference; a CPU's way)",
    )
    attn_max_blocks: int = Field(default=0, ge=0, description="0: each request's whole context; else its last N blocks")
    attn_max_tokens: int = Field(default=1 << 18, gt=0, description="gather: gathered tokens per SDPA call (bounds temporaries)")
    order: Literal["block_major", "layer_major"] = Field(
        default="block_major",
        description="block_major: a block's every layer in one run of memory (vLLM's BLHNC), so a 2 MiB block "
        "is a whole chunk and a finished request frees whole chunks; layer_major: one arena per layer "
        "and part, a chunk holding 64 blocks of many requests",
    )

    @property
    def layout(self) -> KVCacheLayout:
        return KVCacheLayout(
            num_layers=self.layers, block_size=self.block_tokens, num_heads=self.kv_heads,
            head_dim=self.head_dim, dtype=self.dtype, order=self.order,
        )

    @property
    def block_bytes(self) -> int:
        return self.layout.block_bytes

    @property
    def group_bytes(self) -> int:
        """What one growth step maps: a chunk in each of the layout's arenas."""
        return self.chunk * self.layout.num_arenas

    @property
    def elastic_chunk_bytes(self) -> int:
        """The chunk an elastic (kvpolicy mode) pool maps by."""
        return self.chunk if self.elastic_chunk is None else self.elastic_chunk

    @property
    def elastic_group_bytes(self) -> int:
        return self.elastic_chunk_bytes * self.layout.num_arenas


class Engine(Strict):
    """How each tenant schedules, as a serving engine does."""

    step_ms: float = Field(gt=0, description="one decode step (inter-token latency); a step never starts early")
    clock: ClockKind = Field(
        default="wall",
        description="wall: trace time is wall time, a late step is not made up for (GPU runs measure real time); "
        "steps: each step advances trace time by step_ms, so a slow machine serves the same trace, only slower (CI)",
    )
    prefill_tokens_per_step: int = Field(gt=0, description="prompt tokens admitted per step (one longer prompt may take a whole step)")
    max_running: int = Field(default=1024, gt=0)
    patience_s: float | None = Field(default=None, gt=0, description="a client leaves a request that waited this long without starting; None: clients wait forever")
    sample_every_s: float = Field(default=0.1, gt=0)
    slo_ttft_s: float = Field(default=2.0, gt=0, description="SLO: a request's first token within this (latency.py)")
    slo_gap_ms: float = Field(default=50.0, gt=0, description="SLO: and no gap between two of its tokens over this")
    give_back_under_pressure: bool = Field(
        default=True,
        description="kvpolicy mode: pools give back free memory when another tenant is refused (docs/allocator.md)",
    )
    give_back_delay_s: float = Field(
        default=0.0, ge=0,
        description="kvpolicy mode: free memory above the target goes back once it stayed free this long (0: at once); "
        "a busy tenant then reuses a finished request's chunks instead of unmapping and mapping them again",
    )
    give_back_hold_s: float = Field(
        default=0.0, ge=0,
        description="kvpolicy mode: under pressure, memory below the target goes back only once it stayed free this long "
        "(0: at once, the old behaviour); also how long a pool waits to refill its reserve after a give-back or a refusal",
    )
    reserve_blocks: int = Field(
        default=0, ge=0,
        description="kvpolicy mode: free blocks each pool maps ahead of demand between steps (0: none, the old behaviour)",
    )
    pressure_keeps_reserve: bool = Field(
        default=False,
        description="kvpolicy mode: under pressure a pool keeps its use plus the reserve mapped, not use plus one "
        "growth step (False: the old behaviour)",
    )
    yield_above_target_s: float = Field(
        default=0.0, ge=0,
        description="kvpolicy mode: while a tenant was refused memory within this many seconds, new requests take a "
        "pool's memory only up to its target (BlockPool.admission_room; 0: off, the old behaviour)",
    )
    map_between_steps: bool = Field(
        default=False,
        description="map and give back between steps, not inside them: admission takes free blocks only, the growth "
        "for the requests it could not admit and sync()'s give-back run after the step's tokens are out "
        "(engine.py; False: the old behaviour)",
    )
    driver_chunks_between_steps: int | None = Field(
        default=None, ge=1,
        description="kvpolicy mode, with map_between_steps: at most this many chunk groups mapped or unmapped "
        "between two steps (give-back first, then the growth for admission; a lowered limit and the reserve's "
        "top-up excepted), so a long prompt's growth or a large give-back spreads over several intervals "
        "instead of delaying every running request's next token (None: no bound, the old behaviour)",
    )
    check_between_steps: bool = Field(
        default=False,
        description="the benchmark's check of a finished request's KV (its instrument, not engine work) runs after "
        "the step's tokens are out, before the blocks are freed, so a step's time is the engine's own; every mode "
        "alike (engine.py; False: inside the step, as before)",
    )


OLD_ALLOCATOR: dict[str, object] = {"give_back_hold_s": 0.0, "reserve_blocks": 0, "pressure_keeps_reserve": False,
                                    "map_between_steps": False, "yield_above_target_s": 0.0,
                                    "driver_chunks_between_steps": None}
"""``[engine]`` settings of the allocator before issue 17's levers (``Params.old_allocator``)."""


class Budget(Strict):
    elastic: Size = Field(description="the elastic budget A of the three tenants together (kvpolicy mode)")
    static_share: Size = Field(description="each tenant's fixed pool in static mode")


class Device(Strict):
    driver: Literal["cuda", "host"]
    gpu: str = "cuda:0"
    host_capacity: Size | None = Field(default=None, description="host driver: simulated device memory per tenant")

    @property
    def ledger_id(self) -> str:
        """The ledger's key for ``gpu``: on the cuda driver the UUID of device N of ``cuda:N``, as the
        engines' adapters key it (``gpu`` stays the display name the policy's gpu block names)."""
        if self.driver != "cuda" or not self.gpu.startswith("cuda:"):
            return self.gpu
        from kvpolicy.runtime.gpus import gpu_id

        return gpu_id(int(self.gpu.partition(":")[2]))


class DeepSeekV4(Strict):
    """The tenant whose runtime-owned pools count in every budget."""

    model: str = "deepseek-v4-flash"
    geometry: str = Field(description="'tiny', or a model config.json (relative to the parameter file)")
    build: Literal["sglang", "plan", "auto"] = Field(
        default="auto", description="sglang: a real SGLang pool (GPU); plan: hold the bytes `kvpolicy plan` gives; auto: sglang if it can"
    )
    max_running_requests: int = 64
    swa_ratio: float | None = 0.1
    page_size: int = 256
    trace: Trace | None = Field(
        default=None,
        description="requests the V4 tenant serves through SGLang's SWA allocator when the policy marks its "
        "`pool swa { owner elastic }` (dsv4_serve.py); None: it holds its pools idle",
    )
    step_ms: float = Field(default=10.0, gt=0, description="one V4 scheduler round (its clock: `[engine] clock`)")
    prefill_tokens_per_step: int = Field(default=4096, gt=0, description="prompt tokens the V4 tenant admits per round")
    idle_steps: int = Field(default=20, ge=1, description="idle rounds after its trace before it reports (its give-back)")
    sglang_on_cpu: bool = Field(
        default=False,
        description="host driver: build the real SGLang pools on SGLang's CPU path (as dsv4.py --sglang-on-cpu), "
        "with the driver's provisional GPU figures offered in the ledger (there is no GPU to measure)",
    )


class Reload(Strict):
    at_s: float = Field(ge=0, description="kvpolicy mode: when the policy file is edited")
    swap: tuple[str, str] = Field(description="the two models whose settings the edit swaps")
    fields: tuple[Literal["priority", "weight", "min", "max"], ...] = ("priority",)


class Params(Strict):
    name: str
    policy: Path
    tenants: tuple[str, ...]
    trace: Trace
    engine: Engine
    kv: KV
    budget: Budget
    device: Device
    dsv4: DeepSeekV4
    reload: Reload
    source: Path | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        if len(set(self.tenants)) != len(self.tenants):
            raise ValueError(f"tenant names repeat: {self.tenants}")
        for name in self.reload.swap:
            if name not in self.tenants:
                raise ValueError(f"reload.swap names {name!r}, which is not a tenant ({', '.join(self.tenants)})")
        if not 0 <= self.reload.at_s < self.trace.duration_s:
            raise ValueError(f"reload.at_s {self.reload.at_s} must lie inside the trace (0 to {self.trace.duration_s} s)")
        if self.kv.chunk % (2 << 20) or self.kv.elastic_chunk_bytes % (2 << 20):
            raise ValueError(f"kv.chunk and kv.elastic_chunk must be multiples of 2 MiB, got {self.kv.chunk}, {self.kv.elastic_chunk}")
        if self.budget.static_share * len(self.tenants) > self.budget.elastic:
            raise ValueError(
                f"static shares ({len(self.tenants)} × {self.budget.static_share} B) exceed the elastic budget "
                f"{self.budget.elastic} B: the two modes would not have the same memory"
            )
        return self

    def scaled(self, factor: float) -> Params:
        """The same run with every duration multiplied by ``factor`` (a shorter smoke run); rates unchanged."""
        if factor == 1:
            return self
        t = self.trace
        trace = t.model_copy(update={k: getattr(t, k) * factor for k in ("duration_s", "busy_s", "period_s", "phase_offset_s")})
        reload = self.reload.model_copy(update={"at_s": self.reload.at_s * factor})
        return self.model_copy(update={"trace": trace, "reload": reload, "name": f"{self.name} (durations × {factor:g})"})

    def old_allocator(self) -> Params:
        """The same run with the allocator's issue-17 settings off: no reserve mapped ahead, no hold
        time, pressure keeping use plus one growth step, elastic pools mapping by ``kv.chunk``
        (the behaviour before them), so one run can
        measure the old and the new give-back against the same static baseline."""
        return self.model_copy(update={"engine": self.engine.model_copy(update=OLD_ALLOCATOR),
                                       "kv": self.kv.model_copy(update={"elastic_chunk": None})})

    @property
    def static_blocks(self) -> int:
        return self.budget.static_share // self.kv.block_bytes

    @property
    def elastic_blocks(self) -> int:
        """The virtual capacity of an elastic pool: it can never outgrow the whole budget."""
        return self.budget.elastic // self.kv.block_bytes

    @property
    def max_request_blocks(self) -> int:
        return math.ceil((self.trace.prompt_tokens[1] + self.trace.output_tokens[1]) / self.kv.block_tokens)


def load_params(path: str | Path) -> Params:
    """Read a parameter file; relative paths in it are resolved against the file that names them.

    A file may say ``extends = "other.toml"``: it is that file with the tables and keys
    it gives replacing the other's, key by key (a trace file gives its ``[trace]``, its
    tenants, policy and budget, and shares everything else — the engine, the KV geometry
    and the allocator's settings — with the file it extends).
    """
    path = Path(path).resolve()
    data = _read(path, seen=())
    data["source"] = str(path)
    return Params.model_validate(data)


def _read(path: Path, seen: tuple[Path, ...]) -> dict:
    if path in seen:
        raise SystemExit(f"colocate: {path}: `extends` loops back to it ({' → '.join(map(str, (*seen, path)))})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SystemExit(f"colocate: {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"colocate: {path}: {exc}") from None
    if "policy" in data:
        data["policy"] = str((path.parent / data["policy"]).resolve())
    geometry = data.get("dsv4", {}).get("geometry")
    if geometry and geometry != "tiny":
        data["dsv4"]["geometry"] = str((path.parent / geometry).resolve())
    base = data.pop("extends", None)
    if base is None:
        return data
    return _merged(_read((path.parent / base).resolve(), (*seen, path)), data)


def _merged(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s keys replacing its own; tables are merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
