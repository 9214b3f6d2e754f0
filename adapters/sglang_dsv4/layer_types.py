"""The layer types transformers 5.19's ``DeepseekV4Config`` builds a ``deepseek_v4`` config with, and what it
refuses in them, as SGLang 0.5.23 loads such a config.

The class renames the legacy names as every class does (``hf_base_config``), then takes ``layer_types`` as given,
or else from the compress ratios (``0``, ``4``, ``128`` → sliding, compressed sparse, heavily compressed
attention), or else its own pattern; ``mlp_layer_types`` as given or ``hash_moe`` for the first hash layers, then
``moe``. It keeps the first ``num_hidden_layers`` entries of each, and its validator requires exactly that many,
each of its own few types. (SGLang's alias of ``DeepseekV3Config``, built after it, refuses nothing more in them:
measured.) A ``deepseek_v41`` config is built with ``DeepseekV3Config``, whose base class's validator checks
them instead (``hf_base_config.layer_types_problem``). Pure rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hf_base_config import BaseProblem, layer_count, renamed, unknown_layer_type

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

V4_LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
V4_MLP_LAYER_TYPES = ("hash_moe", "moe")
V4_DEFAULT_LAYERS = 43
"""``DeepseekV4Config``'s ``num_hidden_layers`` where the file gives none."""


def v4_layer_types_problem(config: Mapping[str, Any], shown: Callable[[Any], str] = repr) -> BaseProblem | None:
    """What ``DeepseekV4Config``'s validator refuses in the layer types a config gives (the class checks their
    kind first: lists of names), None if nothing: for ``layer_types`` then ``mlp_layer_types``, fewer entries
    than the layers, then an entry of no V4 type among the first ``num_hidden_layers``."""
    layers = config.get("num_hidden_layers", V4_DEFAULT_LAYERS)
    if not isinstance(layers, int):
        return None  # its kind is refused first
    for key, allowed in (("layer_types", V4_LAYER_TYPES), ("mlp_layer_types", V4_MLP_LAYER_TYPES)):
        value = config.get(key)
        if not isinstance(value, list):
            continue  # none given: the class derives valid ones
        entries = (renamed(value) if key == "layer_types" else value)[:layers]
        if len(entries) != layers:
            return layer_count(key, len(entries), layers)
        unknown = unknown_layer_type(key, value, entries, allowed, shown)
        if unknown is not None:
            return unknown
    return None
