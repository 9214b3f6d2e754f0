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


DEEPSEEK_V4_POOLS = frozenset({"swa", "c4", "c128", "indexer", "compressor_state"})

ENGINES: dict[str, EngineVocabulary] = {
    "sglang": EngineVocabulary(
        name="sglang",
        # DeepSeek-V4's runtime-owned pools, the request-to-token table SGLang allocates beside
        # them (`req_to_token`), and `other` for buffers the adapter does not recognise.
        pools=DEEPSEEK_V4_POOLS | {"req_to_token", "other"},
        elastic_pools=frozenset(),
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
        # the decode hot path). Mirrors kvpolicy.adapters.vllm_adapter.pools.VLLM_ELASTIC_POOLS.
        elastic_pools=frozenset({"full", "mla", "sliding_window"}),
    ),
}

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
