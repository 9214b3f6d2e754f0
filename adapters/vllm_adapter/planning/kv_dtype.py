"""The KV cache dtype vLLM stores for a model config and ``--kv-cache-dtype``: the flag as vLLM resolves it for
the checkpoint's ``quantization_config``.

vLLM 0.32 and 0.33 run the same code for it (tests/vllm/test_vllm_kv_dtype.py):

- **The cache config** (``EngineArgs.create_engine_config`` → ``resolve_kv_cache_dtype_string``): under
  ``auto``, a ModelOpt checkpoint (``quant_method`` starting with ``modelopt``) stores what its KV algorithm
  says — ``kv_cache_scheme`` or ``kv_cache_quant_algo``, at the top of the quantization config or under its
  ``quantization``: fp8 → ``fp8_e4m3``, nvfp4 → ``nvfp4`` (any case), a scheme dict of 8-bit floats with
  ``dynamic: false`` → ``fp8_e4m3``, of 4-bit floats → ``nvfp4``, anything else → ``auto`` (the model's dtype).
  The attention backends, and so the block sizes, see this dtype.
- **The attention layers** (``Attention.__init__``): under ``auto``, a compressed-tensors checkpoint that
  declares a ``kv_cache_scheme`` (llm-compressor's FP8 KV) stores ``fp8`` in its standard attention layers
  (full and sliding-window). vLLM's MLA layers (``MLAAttention``) and DeepSeek-V4's attention do not read it:
  they keep the cache config's dtype.
- **Refusals, as vLLM builds the first attention layer**: a compressed-tensors ``kv_cache_scheme`` that vLLM cannot
  load (not 8-bit float, a strategy other than tensor or attn_head, not symmetric); and an explicit
  ``--kv-cache-dtype fp8_e5m2`` where the layer loads KV scales from the checkpoint ("fp8_e5m2 kv-cache is not
  supported with fp8 checkpoints"): ``fp8`` (Fp8Config), ``quark`` and ModelOpt checkpoints (MiniMax's ``mxfp8``,
  which ModelOpt's MXFP8 config serves, too), and compressed-tensors ones that declare a ``kv_cache_scheme`` — in
  standard attention layers, and for ModelOpt (but mixed precision) in MLA layers too. A Quark checkpoint's
  attention layers that its ``exclude`` names load none: vLLM refuses at the first one it does not name
  (``quark.py``, with Quark's other refusals).

vLLM reads the quantization config (``quant_config``) from config.json's ``quantization_config``; a config.json
without one from ``hf_quant_config.json`` beside it (ModelOpt 0.29 and before: ``load_config`` adds it); and for the
model's layers (not the cache config) from ``compression_config`` (older compressed-tensors) or a multimodal
config's ``text_config``. Before any of it vLLM normalises ``quant_method``: lower case, ``compressed_tensors`` →
``compressed-tensors``, and a ModelOpt export named by its ``producer`` gets ``modelopt``, ``modelopt_fp4`` or
``modelopt_mixed`` from its ``quant_algo`` (an algorithm vLLM does not know is refused).

Every other quantization method (fp8, AWQ, GPTQ, bitsandbytes, MXFP4, Quark...) leaves ``auto`` the model's dtype.
Whether vLLM knows the method and takes the model dtype for it is ``quant_method``'s; what the config says of the
weights' kernels otherwise is not the plan's. kvpolicy does not plan an nvfp4 KV cache: a checkpoint whose ``auto``
resolves to it is refused, naming the quantization config. Pure code (no torch, no vllm).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpolicy.document_codes import LAUNCH_REFUSED, VALUE_NOT_ALLOWED, WRONG_TYPE

from .config_values import ModelSpecError
from .config_values import shown as _shown
from .quant_config import Quantization, quantization
from .quark import attention_name, check_kv_config, check_quark_config, excludes, is_quark
from .quark import first_kv_layer as _quark_first_kv_layer

MODELOPT_KV_ALGOS = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
"""A ModelOpt KV algorithm (lower-cased) → the cache dtype vLLM stores; any other falls back to auto."""
CT_KV_STRATEGIES = ("tensor", "attn_head")
"""The compressed-tensors KV scale strategies vLLM loads."""
CT_STRATEGIES = ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head")
"""compressed-tensors' ``QuantizationStrategy`` values: another name is no strategy at all."""
KV_SCALE_METHODS = ("fp8", "quark")
"""Quantization methods whose standard attention layers always load KV scales from the checkpoint."""
MODELOPT_CLASS_METHODS = ("mxfp8",)
"""Methods vLLM serves with a ModelOpt config class though their name is not ModelOpt's (MiniMax's ``mxfp8``:
ModelOpt's MXFP8 config): their attention layers load KV scales as ModelOpt's do; their cache config reads no KV
algorithm."""
NVFP4_KV = "nvfp4"
FAMILY_NAMES = {"mla": "MLA", "deepseek_v4": "DeepSeek-V4"}


@dataclass(frozen=True)
class KvAlgo:
    """A ModelOpt checkpoint's KV algorithm as vLLM reads it."""

    dtype: str | None
    """The cache dtype it asks for under ``auto``, as vLLM's ``get_kv_cache_quant_algo_string`` maps it (None: no
    algorithm, or no ModelOpt checkpoint)."""
    said: str = ""
    """Where the checkpoint says so, and what (words)."""
    key: tuple[str, ...] | None = None
    """That value's place in config.json (None: in hf_quant_config.json, or nowhere)."""


def modelopt_kv_algo(quant: Quantization) -> KvAlgo:
    """The KV algorithm of a ModelOpt checkpoint (``dtype`` None for any other)."""
    data = quant.data
    if not quant.method.startswith("modelopt"):
        return KvAlgo(None)
    inner = data.get("quantization", data)
    if not isinstance(inner, Mapping):
        raise ModelSpecError(f"{quant.named}.quantization must be an object (vLLM cannot read "
                             f"{_shown(inner)})", quant.at("quantization"), WRONG_TYPE)
    # vLLM takes the first of these that is set (truthy), the scheme before the algorithm, inner before outer.
    # When none is, vLLM has the last one's value (an empty name or scheme still falls back to auto).
    nested = ("quantization",) if inner is not data else ()
    places = [(inner, nested, "kv_cache_scheme"), (data, (), "kv_cache_scheme"),
              (inner, nested, "kv_cache_quant_algo"), (data, (), "kv_cache_quant_algo")]
    source, prefix, name = next((p for p in places if p[0].get(p[2])), places[-1])
    algo = source.get(name)
    said, key = f"{'.'.join((*prefix, name))} {_shown(algo)}", quant.at(*prefix, name)
    if isinstance(algo, Mapping):
        kind = _scheme_kind(algo)
        return KvAlgo(MODELOPT_KV_ALGOS[kind] if kind else "auto", said, key)
    if isinstance(algo, str):
        return KvAlgo(MODELOPT_KV_ALGOS.get(algo.lower(), "auto"), said, key)
    return KvAlgo(None, said, key)


def _scheme_kind(scheme: Mapping[str, Any]) -> str | None:
    """A ModelOpt KV scheme dict as vLLM names it: fp8 (static 8-bit floats), nvfp4 (4-bit floats), else None."""
    if scheme.get("dynamic") is False and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
        return "fp8"
    if scheme.get("num_bits") == 4 and scheme.get("type") == "float":
        return "nvfp4"
    return None


def cache_dtype(config: Mapping[str, Any], kv_cache_dtype: str) -> str:
    """The cache config's dtype (``CacheConfig.cache_dtype``) for ``--kv-cache-dtype kv_cache_dtype``: the flag,
    or for ``auto`` a ModelOpt checkpoint's KV algorithm (``auto`` otherwise, the model's dtype)."""
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return _cache_algo(quantization(config)).dtype or "auto"


def _cache_algo(quant: Quantization | None) -> KvAlgo:
    """The KV algorithm vLLM's cache config reads of the checkpoint (``dtype`` None: it reads none)."""
    return modelopt_kv_algo(quant) if quant is not None and quant.for_cache else KvAlgo(None)


def ct_kv_scheme(quant: Quantization | None) -> Any:
    """A compressed-tensors checkpoint's ``kv_cache_scheme`` (None: it declares none, or is no such checkpoint)."""
    if quant is None or quant.method != "compressed-tensors":
        return None
    return quant.data.get("kv_cache_scheme")


@dataclass(frozen=True)
class KvDtype:
    """The KV cache dtype of a launch, as vLLM resolves ``--kv-cache-dtype`` for the checkpoint."""

    flag: str
    """--kv-cache-dtype as given."""
    cache: str
    """The cache config's dtype: what the attention backends (and so the block sizes) see; ``auto``: the model's."""
    layers: str
    """What the family's attention layers store (the cache's, or ``fp8`` where a compressed-tensors scheme says)."""
    why: str = ""
    """What the checkpoint's quantization config made of ``auto``, or why it left it ("": it says nothing of it)."""
    key: tuple[str, ...] | None = None
    """Where in config.json the value is that made ``auto`` what it is (None: nowhere, or hf_quant_config.json)."""

    @property
    def shown(self) -> str:
        """The flag as a message names it, with what the checkpoint made of it."""
        if self.layers == self.flag:
            return f"--kv-cache-dtype {self.flag}"
        return f"--kv-cache-dtype {self.flag} ({self.why}: {self.layers})"


def kv_dtype(config: Mapping[str, Any], kv_cache_dtype: str, family: str) -> KvDtype:
    """The KV cache dtype vLLM stores for this config, ``--kv-cache-dtype`` and the model's family (``standard``,
    ``mla`` or ``deepseek_v4``); an nvfp4 cache, which kvpolicy does not plan, is refused (ModelSpecError)."""
    quant = quantization(config)
    if quant is None or kv_cache_dtype != "auto":  # an explicit dtype is what vLLM stores
        return KvDtype(kv_cache_dtype, kv_cache_dtype, kv_cache_dtype)
    algo = _cache_algo(quant)
    cache = algo.dtype or "auto"
    if algo.dtype is not None:
        why = f"{quant.named} ({quant.method}) gives {algo.said}"
        if cache == "auto":
            why += ", which vLLM does not know: it keeps auto"
        resolved = KvDtype(kv_cache_dtype, cache, cache, why, algo.key)
        if cache == NVFP4_KV:
            raise ModelSpecError(
                f"{resolved.shown}: vLLM stores an nvfp4 KV cache for this checkpoint, which kvpolicy does not plan"
                + ("" if family != "deepseek_v4" else " (and vLLM's DeepSeek-V4, whose fp8_ds_mla cache takes fp8 "
                   "only, refuses it)")
                + "; pass --kv-cache-dtype fp8 or the model's dtype to plan another", resolved.key)
        return resolved
    if ct_kv_scheme(quant) is None:
        return KvDtype(kv_cache_dtype, cache, cache)
    declared = f"{quant.named} (compressed-tensors) declares a kv_cache_scheme"
    if family == "standard":
        return KvDtype(kv_cache_dtype, cache, "fp8", declared, quant.at("kv_cache_scheme"))
    family_name = FAMILY_NAMES.get(family, family)
    return KvDtype(kv_cache_dtype, cache, cache, f"{declared}, which vLLM's {family_name} attention does not read")


def check_quant_config(config: Mapping[str, Any]) -> None:
    """Refuse a quantization config vLLM cannot make its quantization method of (as it builds its config, after
    it checked the tensor parallel size): a compressed-tensors ``kv_cache_scheme`` that is not an object, a
    ModelOpt ``kv_cache_quant_algo`` (nested format) that is not a name; ModelSpecError."""
    quant = quantization(config)
    if quant is None:
        return
    if is_quark(quant):
        check_quark_config(quant)
    scheme = ct_kv_scheme(quant)
    if scheme is not None and not isinstance(scheme, Mapping):
        raise ModelSpecError(f"{quant.named}.kv_cache_scheme must be an object (vLLM cannot read "
                             f"{_shown(scheme)})", quant.at("kv_cache_scheme"), WRONG_TYPE)
    inner = quant.data.get("quantization")
    if quant.method.startswith("modelopt") and isinstance(inner, Mapping):
        algo = inner.get("kv_cache_quant_algo")
        if algo is not None and not isinstance(algo, str):
            raise ModelSpecError(f"{quant.named}.quantization.kv_cache_quant_algo must be a string, got "
                                 f"{_shown(algo)} (vLLM refuses the config)",
                                 quant.at("quantization", "kv_cache_quant_algo"), WRONG_TYPE)


def check_attention_kv(config: Mapping[str, Any], kv: KvDtype, family: str, layer: int = 0) -> None:
    """Refuse what vLLM refuses of the KV cache as it builds attention layer ``layer`` (after it picked the
    attention backend): a compressed-tensors ``kv_cache_scheme`` or a Quark KV config it cannot load (standard
    attention), then ``fp8_e5m2`` in a layer that loads KV scales from the checkpoint; ModelSpecError."""
    quant = quantization(config)
    if quant is None or family == "deepseek_v4":  # DeepSeek-V4's attention loads no KV scales
        return
    if is_quark(quant) and family == "standard":
        if excludes(quant, config, attention_name(config, layer)):  # Quark gives it no KV cache method
            return
        check_kv_config(quant)
    scheme = ct_kv_scheme(quant)
    if family == "standard" and scheme is not None:
        _check_ct_scheme(quant, scheme)
    if kv.layers == "fp8_e5m2" and _loads_kv_scales(quant, family):
        raise ModelSpecError(
            f"--kv-cache-dtype fp8_e5m2: {quant.named} ({quant.method}) has vLLM's attention layers load fp8 KV "
            "scales, and vLLM refuses fp8_e5m2 with them (\"fp8_e5m2 kv-cache is not supported with fp8 "
            "checkpoints\") as it builds the model; use fp8 (e4m3) or auto",
            quant.at("kv_cache_scheme") if scheme is not None else quant.at("quant_method"), LAUNCH_REFUSED)


def first_kv_layer(config: Mapping[str, Any], family: str) -> int:
    """The first attention layer whose KV checks differ from none before it: a Quark checkpoint's first standard
    attention layer that ``exclude`` does not name (0 where it names them all, or for any other checkpoint)."""
    quant = quantization(config)
    if not is_quark(quant) or family != "standard" or quant is None:
        return 0
    layers = config.get("num_hidden_layers")
    found = _quark_first_kv_layer(quant, config, layers) if isinstance(layers, int) else None
    return found or 0


def _loads_kv_scales(quant: Quantization, family: str) -> bool:
    """Whether vLLM's quantization method gives this family's attention layers a KV cache method (one that loads
    k/v scales): Fp8Config and Quark for standard attention, compressed-tensors there when it declares a
    scheme, ModelOpt for standard and MLA attention (mixed precision: standard, when it declares a KV algorithm)."""
    if quant.method in KV_SCALE_METHODS:
        return family == "standard"
    if quant.method == "compressed-tensors":
        return family == "standard" and ct_kv_scheme(quant) is not None
    if not quant.method.startswith("modelopt") and quant.method not in MODELOPT_CLASS_METHODS:
        return False
    if _modelopt_algo(quant) != "MIXED_PRECISION":
        return True
    return family == "standard" and _mixed_declares_kv(quant)


def _modelopt_algo(quant: Quantization) -> str:
    inner = quant.data.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, Mapping) else quant.data.get("quant_algo")
    return str(algo).upper()


def _mixed_declares_kv(quant: Quantization) -> bool:
    """Whether a ModelOpt mixed-precision config has a KV algorithm as its config class reads one: the nested
    format's ``kv_cache_quant_algo``, the flat one's ``kv_cache_scheme`` of 8-bit floats."""
    inner = quant.data.get("quantization")
    if isinstance(inner, Mapping):
        return inner.get("kv_cache_quant_algo") is not None
    scheme = quant.data.get("kv_cache_scheme")
    return isinstance(scheme, Mapping) and scheme.get("type") == "float" and scheme.get("num_bits") == 8


def _check_ct_scheme(quant: Quantization, scheme: Mapping[str, Any]) -> None:
    """vLLM's compressed-tensors KV cache method loads 8-bit float scales, per tensor or per head, symmetric (a
    scheme that is no object ``check_quant_config`` refused, before any attention layer was built)."""
    key = quant.at("kv_cache_scheme")
    bits, kind, strategy = scheme.get("num_bits"), scheme.get("type"), scheme.get("strategy")
    refused = "vLLM refuses the model as it builds its first attention layer"
    if kind != "float" or bits != 8:
        raise ModelSpecError(f"{quant.named}.kv_cache_scheme: vLLM's compressed-tensors KV cache takes num_bits 8 "
                             f"and type float only, got num_bits {_shown(bits)}, type {_shown(kind)}; {refused}",
                             key, VALUE_NOT_ALLOWED)
    if strategy not in CT_KV_STRATEGIES:
        what = "no compressed-tensors strategy" if strategy not in CT_STRATEGIES else "a strategy it does not take"
        raise ModelSpecError(f"{quant.named}.kv_cache_scheme: strategy {_shown(strategy)} is {what}; vLLM's "
                             f"compressed-tensors KV cache takes {' or '.join(CT_KV_STRATEGIES)}, and {refused}",
                             key, VALUE_NOT_ALLOWED)
    if not scheme.get("symmetric"):
        raise ModelSpecError(f"{quant.named}.kv_cache_scheme: vLLM's compressed-tensors KV cache takes symmetric "
                             f"scales only, got symmetric {_shown(scheme.get('symmetric'))}; {refused}",
                             key, VALUE_NOT_ALLOWED)


def auto_words(kv: KvDtype, model: str) -> str:
    """What ``--kv-cache-dtype auto`` stores and why, for the plan's ``assumed``: ``model`` (the model's dtype, in
    words), or what the checkpoint's quantization config made of it."""
    if kv.layers != "auto":
        return f"{kv.layers}, as {kv.why}"
    return f"{model}; {kv.why}" if kv.why else model
