"""vLLM 0.33's KV planning as pure code: layer specs → groups → bytes per block → blocks.

The arithmetic of ``vllm/v1/core/kv_cache_planning.py`` (``get_kv_cache_groups``,
``_get_kv_cache_bytes_per_block``, ``get_kv_cache_configs``) and of
``get_max_concurrency_for_kv_cache_config``, for the spec kinds in layer_specs.py, with the
hybrid KV cache manager on and no PP, DCP, HiSparse or speculative decoding. Every
group draws its blocks from one shared pool of ``num_blocks`` blocks of
``bytes_per_block`` bytes; block 0 is vLLM's null block and never holds KV.
tests/vllm compares each figure with vLLM's own planning code run on a CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .layer_specs import LayerSpec, SpecKind, cdiv, is_uniform_type


class PlanError(ValueError):
    """vLLM would refuse these settings at start-up; the message says why, with figures."""


class KVCacheLayout(Enum):
    """vLLM's physical layouts (``vllm/v1/kv_cache_layout.py``): a permutation of [L, B, H, N, C]."""

    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def is_block_outermost(self) -> bool:
        return self.value[0] == 1

    @property
    def is_layer_compact(self) -> bool:
        return self.value[0] == 0

    @property
    def is_block_compact(self) -> bool:
        return set(self.value[:2]) == {0, 1}

    @classmethod
    def from_name(cls, name: str) -> KVCacheLayout:
        aliases = {"NHD": "LBNHC", "HND": "LBHNC"}
        key = aliases.get(name.upper(), name.upper())
        try:
            return cls[key]
        except KeyError:
            names = ", ".join([*cls.__members__, *aliases])
            raise PlanError(f"unknown KV cache layout {name!r} (known: {names})") from None


@dataclass(frozen=True)
class Group:
    """One KV cache group: layers that share a block table.

    ``specs`` is per layer (in ``layers`` order). A block the group holds stores one
    page of every layer in it, ``page_bytes`` in all; the rest of the pool's block
    (``bytes_per_block - page_bytes``) is padding.
    """

    layers: tuple[str, ...]
    specs: tuple[LayerSpec, ...]
    uniform_type: bool
    """vLLM wraps the group in ``UniformTypeKVCacheSpecs`` (layers of one type, several pages)."""

    @property
    def block_size(self) -> int:
        return self.specs[0].block_size

    @property
    def kind(self) -> SpecKind:
        return self.specs[0].kind

    @property
    def page_bytes(self) -> int:
        return sum(s.page_size_bytes for s in self.specs)

    def pool_bytes(self) -> dict[str, int]:
        """Bytes of each kvpolicy pool in one block of this group."""
        out: dict[str, int] = {}
        for s in self.specs:
            out[s.pool] = out.get(s.pool, 0) + s.page_size_bytes
        return out

    def part_bytes(self) -> dict[str, dict[str, int]]:
        """Per pool, bytes of each part in one block of this group (pools with parts only)."""
        out: dict[str, dict[str, int]] = {}
        for s in self.specs:
            if s.part:
                parts = out.setdefault(s.pool, {})
                parts[s.part] = parts.get(s.part, 0) + s.page_size_bytes
        return out

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request at ``max_model_len`` holds in this group, at most."""
        return max(s.blocks_per_request(max_model_len, max_in_flight_tokens) for s in set(self.specs))


def kv_cache_groups(layers: dict[str, LayerSpec], layout: KVCacheLayout) -> list[Group]:
    """Split the layers into groups as ``get_kv_cache_groups`` does (hybrid manager on)."""
    if not layers:
        return []
    names = list(layers)
    specs = list(layers.values())
    if all(s == specs[0] for s in specs):
        return [Group(tuple(names), tuple(specs), uniform_type=False)]
    if is_uniform_type(specs):
        return [Group(tuple(names), tuple(specs), uniform_type=True)]
    if layout.is_block_outermost and len({s.page_size_bytes for s in specs}) > 1:
        return _packed_groups(layers)
    return _uniform_page_size_groups(_unify_page_sizes(layers))


def approximate_gcd(values: list[int], lower_bound: int) -> int:
    """The chunk size d ≥ lower_bound that pads ``values`` up least (ties: larger d)."""
    low = max(1, lower_bound)
    high = max(values)
    if low > high:
        return low
    best_d, best_pad = low, None
    for d in range(low, high + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best_d):
            best_d, best_pad = d, pad
    return best_d


@dataclass
class _Bucket:
    layers: dict[str, LayerSpec]
    by_page: dict[int, list[str]]
    balanced: bool
    max_per_page: int

    @property
    def first(self) -> LayerSpec:
        return next(iter(self.layers.values()))


def _packed_groups(layers: dict[str, LayerSpec]) -> list[Group]:
    """``_get_packed_kv_cache_groups``: block-outermost packing of mixed page sizes."""
    raw: list[dict[str, LayerSpec]] = []
    for name, spec in layers.items():
        for bucket in raw:
            if is_uniform_type([*bucket.values(), spec]):
                bucket[name] = spec
                break
        else:
            raw.append({name: spec})

    buckets: list[_Bucket] = []
    for bucket in raw:
        by_page: dict[int, list[str]] = {}
        for name, spec in bucket.items():
            by_page.setdefault(spec.page_size_bytes, []).append(name)
        counts = Counter(s.page_size_bytes for s in bucket.values())
        buckets.append(
            _Bucket(bucket, by_page, len({len(v) for v in by_page.values()}) == 1, counts.most_common(1)[0][1])
        )

    # Balanced buckets mixing page sizes stay whole: the largest sets a floor on the
    # pattern repeats per group; larger single-size buckets split down toward it.
    min_repeats = max((b.max_per_page for b in buckets if b.balanced and len(b.by_page) > 1), default=0)
    repeats = (
        approximate_gcd([b.max_per_page for b in buckets if b.balanced], lower_bound=min_repeats)
        if min_repeats
        else None
    )

    def num_groups_for(b: _Bucket) -> int:
        return cdiv(b.max_per_page, repeats) if b.balanced and repeats is not None else 1

    def widest_group_bytes(b: _Bucket, n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in b.by_page.items())

    def is_state_bucket(b: _Bucket) -> bool:
        return repeats is None and b.first.kind.is_sliding

    anchor = max(
        (widest_group_bytes(b, len(b.layers) if is_state_bucket(b) else num_groups_for(b)) for b in buckets),
        default=0,
    )
    groups: list[Group] = []
    for b in buckets:
        n = num_groups_for(b)
        if anchor and is_state_bucket(b):
            states_per_block = max(anchor // b.first.page_size_bytes, 1)
            n = max(n, cdiv(len(b.layers), states_per_block))
        if n == 1:
            groups.append(Group(tuple(b.layers), tuple(b.layers.values()), uniform_type=True))
            continue
        pattern = list(zip(*b.by_page.values()))
        for i in range(n):
            names = [name for repeat in pattern[i::n] for name in repeat]
            groups.append(Group(tuple(names), tuple(b.layers[x] for x in names), uniform_type=True))
    return groups


def _unify_page_sizes(layers: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """``unify_kv_cache_spec_page_size``: grow small pages' block size, or pad them."""
    pages = {s.page_size_bytes for s in layers.values()}
    if len(pages) <= 1:
        return layers
    largest = max(pages)
    out: dict[str, LayerSpec] = {}
    for name, spec in layers.items():
        page = spec.page_size_bytes
        if page == largest:
            out[name] = spec
        elif largest % page == 0:
            out[name] = spec.with_block_size(spec.block_size * (largest // page))
        elif spec.kind is not SpecKind.MLA:
            out[name] = spec.with_padded_page(largest)
        else:
            raise PlanError(
                f"layer {name}: its page ({page} B) does not divide the largest page ({largest} B) and MLA "
                "pages cannot be padded; vLLM cannot plan this model with the hybrid KV cache manager"
            )
    return out


def _uniform_page_size_groups(layers: dict[str, LayerSpec]) -> list[Group]:
    """``_get_kv_cache_groups_uniform_page_size``: equal-sized groups of same-spec layers."""
    buckets: dict[LayerSpec, list[str]] = {}
    for name, spec in layers.items():
        buckets.setdefault(spec, []).append(name)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups: list[Group] = []
    for names in buckets.values():
        n = cdiv(len(names), group_size)
        for i in range(n):
            members = names[i::n]
            groups.append(Group(tuple(members), tuple(layers[m] for m in members), uniform_type=False))
    return groups


def validate_layout(groups: list[Group], layout: KVCacheLayout) -> None:
    """``validate_kv_cache_layout``: mixed page sizes need a block-outermost layout."""
    pages = sorted({s.page_size_bytes for g in groups for s in g.specs})
    if len(pages) <= 1:
        return
    if not layout.is_block_compact or (len(groups) > 1 and layout.is_layer_compact):
        raise PlanError(
            f"KV cache layout {layout.name} cannot hold this model's mixed page sizes {pages}; "
            "use a block-outermost layout (BLHNC)"
        )


def bytes_per_block(groups: list[Group], layout: KVCacheLayout) -> int:
    """Bytes one block of the shared pool takes: the largest group's page bytes.

    (``_get_kv_cache_bytes_per_block``; the specs planned here have no block-stride
    alignment, so both layout families give the same figure.)
    """
    del layout  # only alignment would make the layouts differ
    return max(g.page_bytes for g in groups)


def blocks_per_request(groups: list[Group], max_model_len: int, max_in_flight_tokens: int) -> int:
    """Blocks a request at ``max_model_len`` takes from the shared pool: the sum over groups of each
    group's worst case (``_max_memory_usage_bytes_from_groups`` ÷ bytes per block).

    vLLM takes, per group, ``cdiv(max_memory_usage_bytes, page_size_bytes)`` of its spec, and for a
    ``UniformTypeKVCacheSpecs`` group the largest of its layers' (``max_memory_usage_pages``):
    ``Group.blocks_per_request`` is that, whatever the group structure."""
    return sum(g.blocks_per_request(max_model_len, max_in_flight_tokens) for g in groups)


def num_blocks_for_budget(budget: int, block_bytes: int) -> int:
    """``get_kv_cache_configs``: ``available // bytes_per_block`` (the null block included)."""
    return budget // block_bytes


def format_gib(nbytes: int) -> str:
    """vLLM's ``format_gib``: GiB rounded to two places, as its messages print them."""
    return f"{round(nbytes / 2**30, 2)}"


def estimate_max_model_len(request_blocks: Callable[[int], int], block_bytes: int, available: int,
                           max_model_len: int) -> int:
    """``_estimate_max_model_len_from_groups``: vLLM's binary search for the longest max_model_len whose
    one request fits ``available`` bytes (0 if one token does not)."""

    def fits(model_len: int) -> bool:
        return block_bytes * request_blocks(model_len) <= available

    left, right = 1, max_model_len
    if not fits(left):
        return 0
    result = 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            result, left = mid, mid + 1
        else:
            right = mid - 1
    return result


def check_fits(memory: int, block_bytes: int, request_blocks: Callable[[int], int], max_model_len: int) -> None:
    """``_check_enough_kv_cache_memory``: vLLM refuses to start unless one request at ``max_model_len``
    fits in ``memory`` (the budget, or ``num_gpu_blocks_override`` blocks) less the null block.

    ``request_blocks(L)`` is the request's blocks at max_model_len L; the message gives vLLM's figures."""
    available = memory - block_bytes
    if available <= 0:
        raise PlanError(
            f"no available memory for the cache blocks: {memory} bytes do not hold one block of {block_bytes} B "
            "beside the null block (vLLM: 'No available memory for the cache blocks'); raise the budget"
        )
    blocks = request_blocks(max_model_len)
    needed = blocks * block_bytes
    if needed > available:
        estimated = estimate_max_model_len(request_blocks, block_bytes, available, max_model_len)
        hint = (
            f"; based on the available memory, the estimated maximum model length is {estimated}"
            if estimated > 0 else ""
        )
        raise PlanError(
            f"to serve one request at max_model_len {max_model_len}, {format_gib(needed)} GiB of KV cache is "
            f"needed ({blocks} blocks of {block_bytes} B), more than the {format_gib(available)} GiB available "
            f"(the budget less vLLM's null block){hint}; raise the budget or lower --max-model-len"
        )
