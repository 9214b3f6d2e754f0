"""Closed forms for DeepSeek-V4's KV pools on SGLang 0.5.23: budget → token counts → bytes.

Two halves, each matching SGLang byte for byte on the validated path (the tests
compare them with the real ``DSV4PoolConfigurator``, ``ReqToTokenPool`` and
``DeepSeekV4TokenToKVPool`` over random configs):

- ``size_from_budget`` replays ``DSV4PoolConfigurator.calculate_pool_sizes`` and what
  ``KVCacheConfigurator`` does around it (user token cap, ``resolve_max_num_reqs``,
  ``finalize_with_max_running_requests``), float arithmetic in SGLang's order, and
  refuses what SGLang refuses, in SGLang's order, with its reason;
- ``pool_tensors`` lists the tensors SGLang then allocates, in allocation order — the
  request-to-token table, then the V4 pool's — so the footprint model
  (``footprint.py``) can price them.

The validated path is SGLang's default CUDA path: the V4 paged layout (not V4.1,
unified or trtllm), fp32 compressor state, offline c128 compression, no
speculative decoding, no HiSparse, no PP, no PD decode role, no encoder replay.
``kvpolicy plan`` and the adapter's budget hook both use this module; it imports
neither torch nor sglang. What a launch resolves these settings to is ``launch.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from kvpolicy.engines import DEEPSEEK_V4_POOL_NAMES

from . import footprint as fp
from .geometry import ModelGeometry

VALIDATED_SGLANG = "0.5.23"
V4_POOL_NAMES = DEEPSEEK_V4_POOL_NAMES
"""The pools of ``DeepSeekV4TokenToKVPool``."""
REQ_TO_TOKEN = "req_to_token"
"""SGLang's request-to-token table (``ReqToTokenPool.req_to_token``): runtime-owned memory
of the instance beside the V4 pools, reported as a pool of its own."""
POOL_NAMES = (*V4_POOL_NAMES, REQ_TO_TOKEN)

# SGLang constants on the validated path (deepseek_v4_memory_pool.py, pool_configurator.py).
V4_BYTES_PER_TOKEN = 584  # KVLayout.V4.bytes_per_token
V4_PAGE_ALIGN = 576  # KVLayout.V4.page_align
V4_PAGE_SIZE = 256  # _build_dsv4_kv_pool asserts it on CUDA
DEFAULT_SWA_RATIO = 0.1  # DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO
RING_C4 = 8  # compress-state ring rows per SWA page (ratio 4, no speculation)
RING_C128 = 128  # rows per request (ratio 128, no speculation)
STATE_DTYPE_BYTES = 4  # SGLANG_DSV4_COMPRESS_STATE_DTYPE=float32
REQUEST_ESTIMATE_MIN, REQUEST_ESTIMATE_MAX = 2048, 4096
REQ_TO_TOKEN_EXTRA_CONTEXT = 4  # get_req_to_token_extra_context_len() without speculative decoding
REQ_TO_TOKEN_ENTRY_BYTES = 4  # int32 token locations


RefusalKind = Literal[
    "swa_cap_no_room", "swa_too_small", "not_enough_memory", "no_per_token_pool", "page_size", "kv_cache_dtype",
    "elastic_max", "elastic_tp",
]


class PlanError(ValueError):
    """SGLang would refuse these settings (it raises at start-up); the message says why.

    ``kind`` names which of SGLang's checks refuses, so callers (and the tests that
    compare with the real engine) can tell refusals apart without parsing the text.
    """

    def __init__(self, message: str, kind: RefusalKind | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class PlanSettings(BaseModel):
    """The SGLang launch settings that change the V4 pool sizes (SGLang's flag names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    page_size: PositiveInt = V4_PAGE_SIZE
    max_running_requests: PositiveInt | None = None
    """As published (a V4 launch resolves it to 256); without it the configurator estimates 2048..4096."""
    swa_ratio: float | None = Field(default=None, gt=0, le=1)
    """--swa-full-tokens-ratio when resolved as explicitly set (then SWA is sized by ratio);
    a ``deepseek_v4`` launch resolves it to 0.1, a ``deepseek_v41`` one leaves it unset."""
    context_length: PositiveInt | None = None
    """--context-length; default: what SGLang derives from the config."""
    chunked_prefill_size: int = 8192
    """--chunked-prefill-size per attention-DP rank (a launch on a 90–160 GiB GPU resolves 8192)."""
    max_total_tokens: PositiveInt | None = None
    """--max-total-tokens: a user cap on the full-token capacity."""
    attn_dp_size: PositiveInt = 1
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    swa_prefix_tails: NonNegativeInt | None = None
    swa_eviction_interval: PositiveInt = 128
    """SGLANG_SWA_EVICTION_INTERVAL."""

    def context(self, geometry: ModelGeometry) -> int:
        return self.context_length or geometry.derived_context_length


class Tokens(BaseModel):
    """Token capacities of the pools (``full`` is a logical index space, not a buffer)."""

    full: int
    swa: int
    c4: int
    c128: int


@dataclass(frozen=True)
class PoolTensor:
    """One tensor the pool allocates: which pool it belongs to, its part, its bytes."""

    pool: str
    part: str
    nbytes: int


class Sizes(BaseModel):
    """What SGLang's configurator hands the pool constructor."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["ratio", "cap"]
    tokens: Tokens
    c4_state_pool_size: int
    c128_state_pool_size: int
    max_running_requests: int
    """Per worker, as resolved from the final capacity (``resolve_max_num_reqs``)."""
    budget: int | None = None


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def page_bytes(tokens_per_page: int) -> int:
    """Bytes of one V4-layout KV page (``KVLayout.V4.page_bytes``): padded to 576 B rows."""
    return ceil_div(tokens_per_page * V4_BYTES_PER_TOKEN, V4_PAGE_ALIGN) * V4_PAGE_ALIGN


def indexer_bytes_per_token(index_head_dim: int) -> int:
    """fp8 index K plus one fp32 scale per 128 values."""
    return index_head_dim + index_head_dim // 128 * 4


class _Configurator:
    """``DSV4PoolConfigurator`` on the validated path; same expressions, same float order."""

    def __init__(self, g: ModelGeometry, s: PlanSettings) -> None:
        self.g, self.s = g, s
        self.P = s.page_size
        if self.P % 128:
            raise PlanError(f"page size {self.P}: must be a multiple of 128 for compressed attention", kind="page_size")
        self.L, self.L4, self.L128 = g.num_hidden_layers, g.layers(4), g.layers(128)
        self.attn_head_dim = g.qk_nope_head_dim + g.qk_rope_head_dim
        self.ring4 = RING_C4 if self.L4 else 0
        self.requested = (
            max(1, s.max_running_requests // s.attn_dp_size) if s.max_running_requests is not None else None
        )
        self.swa_ratio = s.swa_ratio if s.swa_ratio is not None else DEFAULT_SWA_RATIO
        self.swa_cap_tokens = self._swa_cap_tokens()
        self.bytes_per_swa_token = self._bytes_per_swa_token()
        self.bytes_per_full_token = self._bytes_per_full_token()

    @property
    def mode(self) -> Literal["ratio", "cap"]:
        return "ratio" if self.swa_cap_tokens is None else "cap"

    def _paged(self, ratio: int = 0) -> float:
        p = self.P // ratio if ratio else self.P
        return page_bytes(p) / p

    def _swa_cap_tokens(self) -> int | None:
        # Cap mode: SGLang sizes SWA from the request cap when max_running_requests is
        # set (a V4 launch always sets it) and the ratio is not explicit (deepseek_v41).
        s = self.s
        if s.swa_ratio is not None or self.requested is None:
            return None
        if s.chunked_prefill_size is None or s.chunked_prefill_size <= 0:
            return None
        window = self.g.sliding_window
        per_request = (window + s.swa_eviction_interval * 1 + self.P) + self.P
        chunks_in_flight = 1 if s.disable_overlap_schedule else 2
        cap = per_request * self.requested + chunks_in_flight * s.chunked_prefill_size + self.P
        if s.swa_prefix_tails is not None:
            tails = s.swa_prefix_tails
        elif s.disable_radix_cache:
            tails = 0
        else:
            tails = 4 * self.requested
        headroom = tails * (window + self.P)
        return ceil_div(cap + headroom, self.P) * self.P

    def _bytes_per_swa_token(self) -> float:
        c4_state_bytes = 2 * 2 * self.attn_head_dim * STATE_DTYPE_BYTES
        c4_indexer_state_bytes = 2 * 2 * self.g.index_head_dim * STATE_DTYPE_BYTES
        c4_state_ratio = self.ring4 / self.P
        return self._paged() * self.L + (
            c4_state_ratio * (c4_state_bytes + c4_indexer_state_bytes) * self.L4
        )

    def _compressed_bytes_per_full_token(self, ratio: int) -> float:
        if ratio == 4:
            c4_frac = 1 / (4 * 1)
            return c4_frac * self._paged(4) + 1 / 4 * indexer_bytes_per_token(self.g.index_head_dim)
        return 1 / 128 * self._paged(128)

    def _bytes_per_full_token(self) -> float:
        swa_ratio = 0 if self.swa_cap_tokens is not None else self.swa_ratio
        owners = [(r, n) for r, n in ((4, self.L4), (128, self.L128)) if n]
        return swa_ratio * self.bytes_per_swa_token + sum(
            self._compressed_bytes_per_full_token(r) * n for r, n in owners
        )

    def _requests_estimate(self, available_bytes: int) -> int:
        if self.requested is not None:
            return self.requested
        full_token = int(available_bytes / self.bytes_per_full_token)
        estimated = int(full_token / self.s.context(self.g) * 512)
        estimated = max(min(estimated, REQUEST_ESTIMATE_MAX), REQUEST_ESTIMATE_MIN)
        return min(estimated, full_token // 2)

    def _c128_state_fixed_bytes(self, requests: int) -> int:
        if not self.L128:
            return 0
        state_rows = (requests + 1) * RING_C128 + RING_C128 + 1
        state_rows = ceil_div(state_rows, 128) * 128
        return state_rows * 2 * self.attn_head_dim * STATE_DTYPE_BYTES * self.L128

    def _check_sizable(self) -> None:
        """SGLang sizes every launch from a profiled budget first (``--max-total-tokens`` only caps what
        that gives), dividing by the bytes per full token: with none, it cannot start."""
        if self.bytes_per_full_token == 0:
            raise PlanError(
                "SGLang 0.5.23 cannot size this pool: no layer has storage that grows with the full tokens "
                "(no ratio-4 or ratio-128 layer) and SWA is sized by the request cap, so its configurator "
                "divides by zero bytes per full token, with or without --max-total-tokens. Give --swa-ratio",
                kind="no_per_token_pool",
            )

    def full_tokens_for_budget(self, available_bytes: int) -> int:
        """``calculate_pool_sizes`` up to the full-token count (before its ``_compute_dsv4_sizes``)."""
        self._check_sizable()
        c128_fixed = self._c128_state_fixed_bytes(self._requests_estimate(available_bytes))
        swa_fixed = 0 + (0 if self.swa_cap_tokens is None else self.swa_cap_tokens * self.bytes_per_swa_token)
        fixed = c128_fixed + 0 + swa_fixed + 0 + 0
        for_tokens = max(available_bytes - fixed, 0)
        full = int(for_tokens / self.bytes_per_full_token)
        full = full // self.P * self.P
        while full > 0 and full * self.bytes_per_full_token + 0 > for_tokens:
            full -= self.P
        if full <= 0 and self.swa_cap_tokens is not None:
            raise PlanError(
                f"SGLang's SWA pool cap ({self.swa_cap_tokens} tokens, from {self.requested} running "
                f"requests) leaves no room for the full KV pool within {available_bytes} bytes: lower "
                "--max-running-requests or --swa-prefix-tails, or raise the budget",
                kind="swa_cap_no_room",
            )
        return full

    def _pool_tokens(self, full: int) -> tuple[int, int]:
        """``_compute_dsv4_sizes`` and the ``MemoryPoolConfig`` check: (full, swa) tokens, or SGLang's refusal."""
        P = self.P
        full = full // P * P
        if self.swa_cap_tokens is None:
            swa = int(full * self.swa_ratio) // P * P
            if self.g.sliding_window + P >= swa:
                raise PlanError(
                    f"SWA pool ({swa} tokens) cannot hold even one request: SGLang admits a request only "
                    f"into more than sliding window ({self.g.sliding_window}) + page size ({P}) tokens; "
                    "raise the budget, the full tokens or --swa-ratio",
                    kind="swa_too_small",
                )
        else:
            swa = self.swa_cap_tokens
        if full <= 0:
            raise PlanError(
                "not enough memory: no full-token page of the KV cache fits (SGLang: 'Not enough memory'); "
                f"{self.bytes_per_full_token:.2f} bytes per full token",
                kind="not_enough_memory",
            )
        return full, swa

    def sizes_for_budget(self, budget: int) -> Sizes:
        """``config_from_budget``: the budget's sizes, then the user token cap re-applied."""
        full, swa = self._pool_tokens(self.full_tokens_for_budget(budget))
        cap = self.s.max_total_tokens
        if cap is not None and cap < full:
            full, swa = self._pool_tokens(cap)
        return self._finalized(full, swa, budget)

    def sizes_for_full_tokens(self, full: int) -> Sizes:
        """``calculate_pool_sizes_from_max_tokens``: sizes for a pinned full-token count."""
        self._check_sizable()
        cap = self.s.max_total_tokens
        full, swa = self._pool_tokens(full if cap is None else min(full, cap))
        return self._finalized(full, swa, None)

    def _finalized(self, full: int, swa: int, budget: int | None) -> Sizes:
        """``resolve_max_num_reqs`` and ``finalize_with_max_running_requests``."""
        estimated = int(full / self.s.context(self.g) * 512)
        estimated = max(min(estimated, REQUEST_ESTIMATE_MAX), REQUEST_ESTIMATE_MIN)
        requests = min(self.requested if self.requested is not None else estimated, full // 2)
        return Sizes(
            mode=self.mode,
            tokens=Tokens(full=full, swa=swa, c4=full // 4, c128=full // 128),
            c4_state_pool_size=swa // self.P * self.ring4,
            c128_state_pool_size=(requests + 1) * RING_C128 if self.L128 else 0,
            max_running_requests=requests,
            budget=budget,
        )


def size_from_budget(geometry: ModelGeometry, settings: PlanSettings, budget: int) -> Sizes:
    """The sizes SGLang's configurator picks when ``_profile_available_bytes`` returns ``budget``."""
    return _Configurator(geometry, settings).sizes_for_budget(budget)


def size_from_full_tokens(geometry: ModelGeometry, settings: PlanSettings, full: int) -> Sizes:
    """The sizes for a given full-token capacity (as ``--max-total-tokens`` would pin it)."""
    return _Configurator(geometry, settings).sizes_for_full_tokens(full)


def req_to_token_bytes(settings: PlanSettings, geometry: ModelGeometry, max_running_requests: int) -> int:
    """``ReqToTokenPool.req_to_token``: int32, (requests + 1 padding row) × (context length + 4)."""
    rows = max_running_requests + 1
    return rows * (settings.context(geometry) + REQ_TO_TOKEN_EXTRA_CONTEXT) * REQ_TO_TOKEN_ENTRY_BYTES


def pool_tensors(geometry: ModelGeometry, settings: PlanSettings, sizes: Sizes) -> list[PoolTensor]:
    """The device tensors SGLang allocates for these sizes, in order: ``ReqToTokenPool``'s table,
    then what ``DeepSeekV4TokenToKVPool.__init__`` creates."""
    g, P, t = geometry, settings.page_size, sizes.tokens
    if P != V4_PAGE_SIZE:
        raise PlanError(
            f"page size {P}: SGLang 0.5.23 builds DeepSeek-V4 pools only with page size {V4_PAGE_SIZE} on CUDA "
            "('In paged swa mode, page_size must be 256.')",
            kind="page_size",
        )
    table = req_to_token_bytes(settings, geometry, sizes.max_running_requests)
    out: list[PoolTensor] = [PoolTensor(REQ_TO_TOKEN, REQ_TO_TOKEN, table)]

    def pages(size: int, tokens_per_page: int) -> int:
        # The allocator reserves one logical (full) page, hence size + P.
        return ceil_div(size + P, tokens_per_page)

    out += [PoolTensor("swa", "kv", pages(t.swa, P) * page_bytes(P))] * g.num_hidden_layers
    if g.layers(4):
        out += [PoolTensor("c4", "kv", pages(t.c4, P // 4) * page_bytes(P // 4))] * g.layers(4)
    if g.layers(128):
        out += [PoolTensor("c128", "kv", pages(t.c128, P // 128) * page_bytes(P // 128))] * g.layers(128)
    if g.layers(4):
        per_page = (P // 4) * indexer_bytes_per_token(g.index_head_dim)
        out += [PoolTensor("indexer", "k", pages(t.c128 * 32, P // 4) * per_page)] * g.layers(4)
    num_req_slots = sizes.max_running_requests + 1
    c128_state = max(sizes.c128_state_pool_size, num_req_slots * RING_C128)
    for ratio in g.stage_ratios:
        if ratio == 4:
            rows = ceil_div(sizes.c4_state_pool_size + RING_C4 + 1, 4) * 4
            out.append(PoolTensor("compressor_state", "c4", rows * 4 * g.head_dim * STATE_DTYPE_BYTES))
            out.append(
                PoolTensor("compressor_state", "c4_indexer", rows * 4 * g.index_head_dim * STATE_DTYPE_BYTES)
            )
        elif ratio == 128:
            rows = ceil_div(c128_state + RING_C128 + 1, 128) * 128
            out.append(PoolTensor("compressor_state", "c128", rows * 2 * g.head_dim * STATE_DTYPE_BYTES))
    return out


class PoolFigures(BaseModel):
    """One pool: tensor bytes, what the GPU loses (footprint), and its parts."""

    bytes: int
    footprint: int
    tensors: int
    parts: dict[str, int] = Field(default_factory=dict)


class SWAElasticPolicy(BaseModel):
    """A policy's ``pool swa { owner elastic }`` on one GPU, resolved to bytes (``elastic_policy.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chunk: PositiveInt
    """The GPU's mapping granularity (``chunk``)."""
    guarantee: NonNegativeInt = 0
    """The model's ``min``."""
    maximum: NonNegativeInt
    """The model's ``max`` (and the pool's own ``max``, if lower)."""


class ElasticPool(BaseModel):
    """An SGLang pool on the allocator: SGLang's per-layer tensors as views over one virtual reservation
    per layer, chunk ``c`` mapped in every layer together (a chunk group of ``layers × chunk`` bytes)."""

    model_config = ConfigDict(frozen=True)

    layers: int
    pages: int
    """Pages per layer, SGLang's padding page 0 included."""
    page_bytes: int
    tensor_bytes: int
    """What SGLang's tensors span: ``layers × pages × page_bytes`` (the pool as SGLang would allocate it)."""
    chunk: int
    virtual: int
    """Address space reserved: each layer's tensor rounded up to whole chunks."""
    pinned: int
    """The chunk groups holding page 0 (SGLang writes padded tokens there): mapped at start and never given
    back, admitted with the ``reserve`` as runtime-owned memory."""
    guarantee: int
    """Elastic bytes the policy guarantees (whole chunk groups, at most ``limit``)."""
    limit: int
    """The most elastic bytes mapped beyond ``pinned``: the policy's ``max``, at most the rest of the
    reservation, in whole chunk groups."""

    @property
    def group_bytes(self) -> int:
        return self.layers * self.chunk


def elastic_swa_pool(geometry: ModelGeometry, settings: PlanSettings, sizes: Sizes, policy: SWAElasticPolicy) -> ElasticPool:
    """The SWA pool of ``sizes`` on the allocator under ``policy``; ``PlanError`` if its ``max`` cannot map one page."""
    P, L, chunk = settings.page_size, geometry.num_hidden_layers, policy.chunk
    pages = ceil_div(sizes.tokens.swa + P, P)  # as pool_tensors: the allocator's reserved logical page
    per_page = page_bytes(P)
    group = L * chunk
    per_layer = ceil_div(pages * per_page, chunk) * chunk
    pinned = ceil_div(per_page, chunk) * group  # the chunks page 0 touches, in every layer
    # One page SGLang can hand out (page 1) may need chunks beyond the pinned ones: the policy's
    # max must cover them (checked on the max alone, so that it is the same for every budget).
    first_page_needs = max(ceil_div(2 * per_page, chunk) * group - pinned, group)
    if policy.maximum // group * group < first_page_needs:
        raise PlanError(
            f"the elastic SWA pool's max ({policy.maximum} B) cannot map one SWA page: a chunk group is "
            f"{L} layers x {chunk} B = {group} B; raise the model's `max` (or the pool's), or lower `chunk`",
            kind="elastic_max",
        )
    limit = min(policy.maximum, L * per_layer - pinned) // group * group
    return ElasticPool(
        layers=L, pages=pages, page_bytes=per_page, tensor_bytes=L * pages * per_page, chunk=chunk,
        virtual=L * per_layer, pinned=pinned, guarantee=min(policy.guarantee // group * group, limit), limit=limit,
    )


class BeyondBudget(BaseModel):
    """Why ``total_bytes`` is not the budget: SGLang sizes only the V4 pools from it, and only approximately.

    ``total = req_to_token + pools``. ``req_to_token``: the request-to-token table, which SGLang
    allocates outside the budget (from the memory ``--mem-fraction-static`` leaves over).
    ``pools``: the V4 pools' tensor bytes minus the budget, SGLang's own rounding: its configurator
    prices a full token at a per-token average (``calculate_pool_sizes``), which leaves out the padding
    page every layer's pool reserves and the state rows rounded up to whole rings, and rounds the
    tokens down to pages; it is positive when the first outweighs the second."""

    model_config = ConfigDict(frozen=True)

    total: int
    req_to_token: NonNegativeInt
    pools: int


class Plan(BaseModel):
    """The pools SGLang builds for some sizes (documented field by field in docs/sglang.md); fields are only
    ever added. ``pools`` has the five V4 pools and ``req_to_token``; the totals cover all six."""

    schema_: Literal[1] = Field(default=1, alias="schema")
    engine: Literal["sglang"] = "sglang"
    engine_version: str = VALIDATED_SGLANG
    tokens: Tokens
    pools: dict[str, PoolFigures]
    total_bytes: int
    total_footprint: int
    budget: int | None = None
    """The available-bytes budget the configurator was given (absent with --full-tokens)."""
    mode: Literal["ratio", "cap"]
    """How SWA is sized: a ratio of full tokens, or a cap from the running requests."""
    max_running_requests: int
    settings: PlanSettings
    elastic: dict[str, ElasticPool] = Field(default_factory=dict)
    """Pools on the allocator (``swa`` when the policy marks it ``owner elastic``): their ``footprint`` in
    ``pools`` is the pinned part only, the rest is mapped on demand under the elastic budget."""
    beyond_budget: BeyondBudget | None = None
    """With a budget: how ``total_bytes`` differs from it, and why (None with --full-tokens)."""

    model_config = ConfigDict(populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def figures(tensors: list[PoolTensor]) -> dict[str, PoolFigures]:
    """Per pool: bytes and footprint (tensors priced in order on an empty caching allocator)."""
    charges = fp.footprints(t.nbytes for t in tensors)
    acc: dict[str, PoolFigures] = {name: PoolFigures(bytes=0, footprint=0, tensors=0) for name in POOL_NAMES}
    for tensor, charge in zip(tensors, charges):
        f = acc.setdefault(tensor.pool, PoolFigures(bytes=0, footprint=0, tensors=0))
        f.bytes += tensor.nbytes
        f.footprint += charge
        f.tensors += 1
        if tensor.pool == "compressor_state":  # per ratio; the other pools have one part each
            f.parts[tensor.part] = f.parts.get(tensor.part, 0) + tensor.nbytes
    return acc


def make_plan(
    geometry: ModelGeometry, settings: PlanSettings, sizes: Sizes, elastic_swa: SWAElasticPolicy | None = None
) -> Plan:
    """Bytes and footprint per pool for ``sizes``; with ``elastic_swa`` the SWA tensors are views over the
    allocator, so only the other tensors go through the caching allocator (and are priced in order)."""
    tensors = pool_tensors(geometry, settings, sizes)
    elastic: dict[str, ElasticPool] = {}
    if elastic_swa is None:
        pools = figures(tensors)
    else:
        swa = elastic_swa_pool(geometry, settings, sizes, elastic_swa)
        pools = figures([t for t in tensors if t.pool != "swa"])
        pools["swa"] = PoolFigures(bytes=swa.tensor_bytes, footprint=swa.pinned, tensors=swa.layers)
        elastic["swa"] = swa
    total = sum(p.bytes for p in pools.values())
    beyond = None
    if sizes.budget is not None:
        table = pools[REQ_TO_TOKEN].bytes
        beyond = BeyondBudget(total=total - sizes.budget, req_to_token=table, pools=total - table - sizes.budget)
    return Plan(
        tokens=sizes.tokens,
        pools=pools,
        beyond_budget=beyond,
        total_bytes=total,
        total_footprint=sum(p.footprint for p in pools.values()),
        budget=sizes.budget,
        mode=sizes.mode,
        max_running_requests=sizes.max_running_requests,
        settings=settings,
        elastic=elastic,
    )


def plan_for_budget(
    geometry: ModelGeometry, settings: PlanSettings, budget: int, elastic_swa: SWAElasticPolicy | None = None
) -> Plan:
    """The pools SGLang builds from ``budget`` available bytes."""
    return make_plan(geometry, settings, size_from_budget(geometry, settings, budget), elastic_swa)


def plan_for_full_tokens(
    geometry: ModelGeometry, settings: PlanSettings, full: int, elastic_swa: SWAElasticPolicy | None = None
) -> Plan:
    """The pools SGLang builds for ``full`` full tokens."""
    return make_plan(geometry, settings, size_from_full_tokens(geometry, settings, full), elastic_swa)


def budget_for_reserve(
    geometry: ModelGeometry, settings: PlanSettings, reserve: int, elastic_swa: SWAElasticPolicy | None = None
) -> Plan:
    """The budget to hand SGLang so that what it allocates for the KV cache — the V4 pools and the
    request-to-token table — takes at most ``reserve`` bytes of GPU memory (footprint), and as many as fit.

    SGLang's configurator sizes the V4 pools from the budget and allocates the
    request-to-token table outside it, so a budget of exactly ``reserve`` is wrong
    both ways: the table comes on top, the pools come out above the budget (a
    reserved page per layer per pool, state rows rounded up) and the caching
    allocator rounds each tensor up again; and when --max-running-requests is not
    given, SGLang prices the c128 compressor state for up to 4096 requests while
    sizing, then allocates it for the (often 2048) requests it settles on, leaving
    part of the budget unused. So this searches the budget — below or above
    ``reserve`` — for the largest one whose total footprint (pools + table) fits.
    With ``elastic_swa`` the reserve covers the other pools, the table and the SWA
    pool's pinned chunks; the rest of the SWA pool is elastic, so a larger budget (and,
    by ratio, a larger SWA capacity) fits. Raises ``PlanError`` if not even the
    smallest pool SGLang accepts fits, or if the elastic ``max`` cannot map one page.
    """

    def try_budget(budget: int) -> tuple[bool, Plan | None]:
        """(too big?, the plan if it fits); a budget SGLang refuses is too small, not too big."""
        try:
            plan = plan_for_budget(geometry, settings, budget, elastic_swa)
        except PlanError as exc:
            if exc.kind == "elastic_max":
                raise
            return False, None
        return (True, None) if plan.total_footprint > reserve else (False, plan)

    too_big, best = try_budget(reserve)
    lo, hi = 0, reserve
    if not too_big:  # grow until a budget is too big (or the search gives up)
        lo, hi = reserve, 2 * reserve
        while hi <= MAX_BUDGET_FACTOR * reserve:
            too_big, plan = try_budget(hi)
            if too_big:
                break
            lo, hi, best = hi, 2 * hi, plan or best
        else:
            return best if best is not None else _no_fit(geometry, settings, reserve)
    # Invariant: budget hi is too big; best is the fitting plan with the largest budget seen.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        too_big, plan = try_budget(mid)
        if too_big:
            hi = mid
        else:
            lo = mid
            if plan is not None:
                best = plan
    return best if best is not None else _no_fit(geometry, settings, reserve)


def _no_fit(geometry: ModelGeometry, settings: PlanSettings, reserve: int) -> Plan:
    raise PlanError(
        f"a reserve of {reserve} bytes cannot hold the smallest DeepSeek-V4 pool SGLang accepts "
        f"with these settings: {_smallest_pool_hint(geometry, settings, reserve)}"
    )


MAX_BUDGET_FACTOR = 16


def _smallest_pool_hint(geometry: ModelGeometry, settings: PlanSettings, reserve: int) -> str:
    conf = _Configurator(geometry, settings)
    if conf.bytes_per_full_token == 0:
        return "no layer's storage grows with the full tokens, so SGLang cannot size it from a budget"
    requests = conf._requests_estimate(reserve)
    state = conf._c128_state_fixed_bytes(requests)
    table = req_to_token_bytes(settings, geometry, requests)
    if state + table >= reserve:
        how = "--max-running-requests" if settings.max_running_requests is None else "a lower --max-running-requests"
        return (
            f"SGLang sets aside {state} bytes of c128 compressor state for {requests} requests and a "
            f"{table}-byte request-to-token table ({requests + 1} rows of {settings.context(geometry)} tokens) "
            f"before any token; set {how} or a lower --context-length"
        )
    if conf.mode == "cap":
        return f"SWA cap of {conf.swa_cap_tokens} tokens from {conf.requested} running requests"
    need = (geometry.sliding_window + settings.page_size) / conf.swa_ratio
    return f"SWA needs over {math.ceil(need)} full tokens at swa ratio {conf.swa_ratio}"
