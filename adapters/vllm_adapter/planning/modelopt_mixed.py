"""What vLLM 0.33's ModelOpt mixed-precision config refuses of a checkpoint's ``quantized_layers`` as it builds
the config at start-up (``ModelOptMixedPrecisionConfig.from_config`` and its constructor).

The layers' recipes sit beside ``quant_algo``: in the nested ``quantization`` where there is one, else at the
quantization config's top level. vLLM needs the mapping non-empty; it reads each recipe with ``.get`` and its
``quant_algo`` (default "") as a string; a GGML block codec (``iq2_xs``, ``iq2_xxs``, ``q8_0``, any case) must
give that codec's group size, block payload bytes and ``packing: "ggml"`` exactly; and the block-scaled FP8 MoE
recipes (``FP8_PB_WO``, ``FP8_BLOCK_SCALES``) must share one ``int()``-able group size (128 where absent). A
recipe's algorithm is otherwise not checked here (vLLM looks it up as it builds each layer). vLLM 0.32 has no
mixed-precision config (``quant_config``). tests/vllm/test_vllm_modelopt_mxfp8.py holds this to vLLM's class over
random recipes. Pure code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE

from .config_values import ModelSpecError
from .config_values import shown as _shown
from .quant_config import Quantization

LAYERS_KEY = "quantized_layers"
GGML_BLOCK_CODECS = {"iq2_xs": (256, 74), "iq2_xxs": (256, 66), "q8_0": (32, 34)}
"""A GGML block codec (lower-cased) → the group size and block payload bytes vLLM requires of its recipes."""
BLOCK_FP8_MOE_ALGOS = ("FP8_PB_WO", "FP8_BLOCK_SCALES")
DEFAULT_BLOCK_GROUP_SIZE = 128


def check_mixed_layers(quant: Quantization, inner: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
    """Refuse the ``quantized_layers`` of ``inner`` (the mapping ``quant_algo`` is in, at ``prefix``) that vLLM's
    mixed-precision config refuses, at the value; ModelSpecError."""
    where = (*prefix, LAYERS_KEY)
    said = f"{quant.named}.{'.'.join(where)}"
    layers = inner.get(LAYERS_KEY, {})
    if not layers:
        raise ModelSpecError(
            f"{said} {'is not given' if LAYERS_KEY not in inner else _shown(layers)}: vLLM's ModelOpt "
            "MIXED_PRECISION config needs a non-empty mapping of layer names to their recipes and refuses the config",
            quant.at(*where), MISSING_FIELD if LAYERS_KEY not in inner else VALUE_NOT_ALLOWED)
    if not isinstance(layers, Mapping):
        raise ModelSpecError(f"{said} must be an object of layer names to recipes (vLLM cannot read "
                             f"{_shown(layers)})", quant.at(*where), WRONG_TYPE)
    algos = {}  # in vLLM's order: every recipe read and its codec checked, then the block group sizes
    for name, recipe in layers.items():
        algos[name] = _recipe_algo(quant, said, where, name, recipe)
        _check_codec_contract(quant, said, where, name, recipe, algos[name])
    block_sizes: dict[int, str] = {}  # a group size → the first recipe that gives it
    for name, algo in algos.items():
        if algo.upper() in BLOCK_FP8_MOE_ALGOS:
            block_sizes.setdefault(_block_group_size(quant, said, where, name, layers[name]), name)
    if len(block_sizes) > 1:
        sizes = ", ".join(f"{size} ({name})" for size, name in sorted(block_sizes.items()))
        raise ModelSpecError(
            f"{said}: vLLM's MIXED_PRECISION config needs one group_size for every block-FP8 MoE recipe "
            f"({', '.join(BLOCK_FP8_MOE_ALGOS)}), got {sizes}, and refuses the config",
            quant.at(*where, list(block_sizes.values())[1], "group_size"), VALUE_NOT_ALLOWED)


def _recipe_algo(quant: Quantization, said: str, where: tuple[str, ...], name: str, recipe: Any) -> str:
    """The recipe's ``quant_algo`` ("" where absent), or the refusal of a recipe vLLM cannot read."""
    if not isinstance(recipe, Mapping):
        raise ModelSpecError(f"{said}.{name} must be an object, the layer's recipe (vLLM cannot read "
                             f"{_shown(recipe)})", quant.at(*where, name), WRONG_TYPE)
    algo = recipe.get("quant_algo", "")
    if not isinstance(algo, str):
        raise ModelSpecError(f"{said}.{name}.quant_algo must be a name (vLLM cannot read {_shown(algo)})",
                             quant.at(*where, name, "quant_algo"), WRONG_TYPE)
    return algo


def _check_codec_contract(quant: Quantization, said: str, where: tuple[str, ...], name: str,
                          recipe: Mapping[str, Any], algo: str) -> None:
    codec = algo.lower()
    if codec not in GGML_BLOCK_CODECS:
        return
    group_size, payload = GGML_BLOCK_CODECS[codec]
    contract = {"group_size": group_size, "block_payload_bytes": payload, "packing": "ggml"}
    wrong = next((key for key, value in contract.items() if recipe.get(key) != value), None)
    if wrong is not None:
        given = _shown(recipe[wrong]) if wrong in recipe else "is not given"
        raise ModelSpecError(
            f"{said}.{name}.{wrong} {given}: vLLM takes a {codec.upper()} recipe with "
            f"group_size {group_size}, block_payload_bytes {payload} and packing \"ggml\" only (\"unsupported "
            f"{codec.upper()} block contract\") and refuses the config",
            quant.at(*where, name, wrong) if wrong in recipe else quant.at(*where, name),
            VALUE_NOT_ALLOWED if wrong in recipe else MISSING_FIELD)


def _block_group_size(quant: Quantization, said: str, where: tuple[str, ...], name: str,
                      recipe: Mapping[str, Any]) -> int:
    """A block-FP8 MoE recipe's group size as vLLM takes it, ``int(value)``."""
    value = recipe.get("group_size", DEFAULT_BLOCK_GROUP_SIZE)
    try:
        return int(value)
    except (ValueError, TypeError, OverflowError):
        raise ModelSpecError(f"{said}.{name}.group_size must be an integer (vLLM refuses {_shown(value)})",
                             quant.at(*where, name, "group_size"), WRONG_TYPE) from None
