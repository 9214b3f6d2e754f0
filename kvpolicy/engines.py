"""What kvpolicy knows of each engine by name: the pools its adapter reports and
which of them it can run elastically. The linter checks policies against this;
the adapters' tests check that what they report stays inside it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineVocabulary:
    name: str
    pools: frozenset[str]
    """Pool names the adapter reports (and a policy may name)."""
    elastic_pools: frozenset[str]
    """Pools the adapter can back with the elastic allocator (``owner elastic``)."""

    @property
    def supports_elastic(self) -> bool:
        return bool(self.elastic_pools)


DEEPSEEK_V4_POOL_NAMES = ("swa", "c4", "c128", "indexer", "compressor_state")
"""DeepSeek-V4's five pools, in the order both adapters report them."""
DEEPSEEK_V4_POOLS = frozenset(DEEPSEEK_V4_POOL_NAMES)
VLLM_ELASTIC_POOL_NAMES = ("full", "mla", "sliding_window")
"""The pools the vLLM adapter can back with the elastic allocator, in the order its messages name them."""

ENGINES: dict[str, EngineVocabulary] = {
    "sglang": EngineVocabulary(
        name="sglang",
        # DeepSeek-V4's runtime-owned pools, the request-to-token table SGLang allocates beside
        # them (`req_to_token`), and `other` for buffers the adapter does not recognise.
        pools=DEEPSEEK_V4_POOLS | {"req_to_token", "other"},
        # The sliding-window KV pool is a plain paged pool with its own allocator, read on
        # the decode path only through page indices: the adapter can back it with the
        # allocator (adapters/sglang_dsv4/elastic.py). The others stay runtime-owned, for
        # the reasons in RUNTIME_OWNED_WHY.
        elastic_pools=frozenset({"swa"}),
    ),
    "vllm": EngineVocabulary(
        name="vllm",
        # DeepSeek-V4's five pools, one pool per KV spec type for other models, and
        # the report-only `padding` (block tails, the null block, rounding) and
        # `free_blocks`, with which a rank's pools add up to its whole buffer.
        pools=DEEPSEEK_V4_POOLS
        | {"full", "mla", "sliding_window", "sliding_window_mla", "chunked_local", "mamba", "cross_attention"}
        | {"other", "padding", "free_blocks"},
        # Standard attention caches run on the allocator (adapters/vllm_adapter/elastic/);
        # DeepSeek-V4's pools stay runtime-owned (its indexer aliases compressed entries on
        # the decode hot path).
        elastic_pools=frozenset(VLLM_ELASTIC_POOL_NAMES),
    ),
}

RUNTIME_OWNED_WHY: dict[str, str] = {
    "c4": "the compressed pools are written by the compressor and read through the indexer's entries, "
    "which alias them on the decode hot path",
    "c128": "the compressed pools are written by the compressor and read through the indexer's entries, "
    "which alias them on the decode hot path",
    "indexer": "the indexer aliases compressed entries on the decode hot path",
    "compressor_state": "the compressor state is ring state addressed per SWA page and per request slot, "
    "rewritten on every step",
    "req_to_token": "the request-to-token table is indexed by request slot on every step, a fixed table",
}
"""Why a DeepSeek-V4 pool (and SGLang's request table) stays runtime-owned: lint's and the adapters' reason."""

ANY_ENGINE = "any"
"""A model block without ``engine`` binds instances of any engine."""


def pool_vocabulary(engine: str | None) -> frozenset[str]:
    """Pool names valid for ``engine`` (all known pools when the engine is not given)."""
    if engine is None or engine == ANY_ENGINE or engine not in ENGINES:
        return frozenset().union(*(e.pools for e in ENGINES.values()))
    return ENGINES[engine].pools


def elastic_pools(engine: str | None) -> frozenset[str]:
    if engine is None or engine == ANY_ENGINE or engine not in ENGINES:
        return frozenset().union(*(e.elastic_pools for e in ENGINES.values()))
    return ENGINES[engine].elastic_pools
