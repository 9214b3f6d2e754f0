"""A model's ``config.json`` → the per-layer KV cache specs vLLM 0.33 gives it on CUDA.

Pure code (no torch, no vllm, no transformers): ``kvpolicy plan`` runs on a bare
install. Three families are understood, each checked against vLLM's own model
classes in tests/vllm:

- **DeepSeek-V4** (``model_type: deepseek_v4``, or a ``compress_ratios`` list): per
  layer a sliding-window cache, and on compressed layers the compressed KV, the
  compressor state, and on ratio-4 layers the indexer cache and its compressor
  state — vLLM's modules ``DeepseekV4SWACache``, ``DeepseekV4Attention``,
  ``CompressorStateCache``, ``DeepseekV4IndexerCache`` on the FlashMLA (fp8_ds_mla) path.
  Fields read: ``num_hidden_layers``, ``head_dim``, ``index_head_dim``,
  ``sliding_window``, and ``compress_ratios`` (or ``layer_types`` + ``compress_rates``).
- **MLA** (a ``kv_lora_rank`` field: DeepSeek-V2/V3, Kimi-K2): one latent of
  ``kv_lora_rank + qk_rope_head_dim`` per token. Fields read: ``num_hidden_layers``,
  ``kv_lora_rank``, ``qk_rope_head_dim``, ``torch_dtype``/``dtype``.
- **Standard attention** (Llama, Qwen, Mistral, Gemma, gpt-oss, …): per layer full
  attention, or sliding-window attention where the model's class puts a window
  (``_standard_layer_windows``, ``sliding_window``). Fields read: ``num_hidden_layers``, ``num_attention_heads``,
  ``num_key_value_heads``, ``head_dim`` (default ``hidden_size / num_attention_heads``),
  ``layer_types``, ``sliding_window``, ``use_sliding_window``, ``max_window_layers``,
  ``torch_dtype``/``dtype``.

A key the file omits is its config class's default (``class_defaults``, for the model types
kvpolicy knows), the KV cache dtype is ``--kv-cache-dtype`` as vLLM resolves it for the checkpoint's
``quantization_config`` (``kv_dtype``), and a launch vLLM refuses as it builds the model is refused in vLLM's
order (``model_build``). Anything else (linear attention, Mamba, DeepSeek-V3.2's indexer,
encoder-decoder, layers that differ by a ``per_layer_config``) is refused with a message, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from kvpolicy.document_codes import LAUNCH_REFUSED, MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE

from ...common import read_config_json
from ...hf_base_config import BASE_KEYS
from ...hf_dtype import DTYPE_KEYS, dtype_key, dtype_problem
from .class_defaults import (
    MAX_LAYERS,
    WRAPPER_SUB_CONFIGS,
    ConfigKey,
    FilledConfig,
    class_default,
    config_class,
    with_class_defaults,
)
from .config_levels import refusal_at_level
from .config_values import ConfigInvalid, ConfigUnreadable, ModelSpecError, int_code, is_int
from .config_values import config_int as _int
from .config_values import shown as _shown
from .kv_dtype import (
    KvDtype,
    check_attention_kv,
    check_quant_config,
    first_kv_layer,
    kv_dtype,
)
from .quant_config import COMPRESSION_KEY, QUANTIZATION_KEY, read_hf_quant_config
from .quant_method import check_act_dtype, check_method_fields
from .layer_specs import LayerSpec, SpecKind
from .model_build import check_build, check_heads
from .sliding_window import check_window, layer_window, model_level_window

Family = Literal["deepseek_v4", "mla", "standard"]

DTYPE_BYTES = {"float32": 4, "float16": 2, "half": 2, "bfloat16": 2, "float": 4}
FLOAT16_REFUSED_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
"""Model types vLLM refuses float16 for (numerical instability): ``--dtype auto`` serves a float16 checkpoint of
theirs in bfloat16, an explicit ``--dtype float16`` is a start-up error."""
ModelDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
MODEL_DTYPES: tuple[ModelDtype, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")
"""``--dtype``'s values, vLLM's ``ModelDType``; half is float16, float is float32."""
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
FP8_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")

# DeepSeek-V4 on vLLM's FlashMLA path (vllm/models/deepseek_v4, v1/attention/backends/mla).
V4_SWA_BLOCK_SIZE = 64  # DeepseekV4SWACache default block_size
V4_PACKED_BYTES_PER_TOKEN = 584  # 448 NoPE + 128 RoPE + 8 scale bytes
V4_FP8_DS_MLA_ALIGNMENT = 576
V4_STATE_DTYPE_BYTES = 4  # compressor states are float32
V4_STATE_BLOCK_SIZE = {4: 4, 128: 8}  # CompressorStateCache block sizes
V4_LAYER_TYPE_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
V4_DEFAULT_COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
MXFP4_BLOCK = 32
FP8_INDEXER_QUANT_BLOCK = 128


class SpecSettings(BaseModel):
    """vLLM launch settings that change the specs (vLLM's flag names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_size: PositiveInt | None = None
    """--block-size; default: what vLLM's CUDA backends pick on Hopper (16; MLA with an fp8 cache 64, FlashMLA's;
    DeepSeek-V4 256)."""
    sliding_window_block_size: PositiveInt | None = None
    """Block size of sliding-window layers; default: --block-size (FlashAttention keeps it)."""
    dtype: ModelDtype = "auto"
    """--dtype, the dtype vLLM serves the model in (``model_dtype``): auto (the checkpoint's, as vLLM resolves it,
    ``auto_dtype``), half or float16, bfloat16, float or float32."""
    kv_cache_dtype: str = "auto"
    """--kv-cache-dtype: auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2; ``auto`` as vLLM resolves it for the
    checkpoint (``kv_dtype``): the model's dtype (``model_dtype``), unless its quantization config says more."""
    indexer_kv_dtype: Literal["fp8", "mxfp4"] = "fp8"
    """DeepSeek-V4 indexer cache format (vLLM's attention_config.indexer_kv_dtype)."""
    tensor_parallel_size: PositiveInt = 1
    """Standard attention splits KV heads across ranks; MLA and DeepSeek-V4 replicate."""


class ModelSpecs(BaseModel):
    """The model's layers as vLLM names and sizes them, in vLLM's layer order."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    family: Family
    block_size: int
    layers: dict[str, LayerSpec] = Field(repr=False)


def load_config(path: Path | str) -> FilledConfig:
    """Read a ``config.json`` with what its config class adds to it (``class_defaults``: for a model type the
    plan knows, every key it reads that the file omits), and where each key is in the file; a file that cannot
    be read is ConfigUnreadable, naming it, one that holds no JSON object ConfigInvalid, with its diagnostics."""
    from kvpolicy.json_text import DocumentInvalid

    p = Path(path)
    try:
        document = read_config_json(p)
    except OSError as exc:
        raise ConfigUnreadable(f"{p}: cannot read the model config: {exc.strerror}") from None
    except DocumentInvalid as exc:
        raise ConfigInvalid(exc) from None
    data = document.data
    # Multimodal wrappers keep the language model's fields in text_config, filled by its own class (the
    # wrapper's model type names it when the text config does not: Gemma-3's).
    text = data.get("text_config")
    if not isinstance(text, dict) or "num_hidden_layers" in data:
        filled = with_class_defaults(data)
        filled.document = document
        return _with_quant_file(filled, data, p)
    inner = with_class_defaults({"model_type": data.get("model_type"), **text}, home=("text_config",))
    if "model_type" not in text:
        inner.origins["model_type"] = ("model_type",)
    origins = {**{k: (k,) for k in data}, **inner.origins, "text_config": ("text_config",)}
    merged = {**data, **inner, "text_config": inner}
    for key in (QUANTIZATION_KEY, COMPRESSION_KEY):  # vLLM reads the wrapper's own before its text config's
        if key in data:
            merged[key], origins[key] = data[key], (key,)
    if dtype_key(data) is not None:  # the wrapper's dtype too: its keys alone, as transformers resolved them there
        _wrappers_own(DTYPE_KEYS, data, merged, origins)
    _wrappers_own(BASE_KEYS, data, merged, origins)  # as transformers builds the wrapper (the text config's: under it)
    filled = FilledConfig(merged, inner.class_defaults, origins, ("text_config",), document, inner.as_written)
    return _with_quant_file(filled, data, p)


def _wrappers_own(keys: tuple[str, ...], data: Mapping[str, Any], merged: dict[str, Any],
                  origins: dict[str, ConfigKey]) -> None:
    """Only the wrapper's own values of ``keys`` (``data``, in its file's order) in ``merged``, none lifted from its
    text config."""
    for key in keys:
        merged.pop(key, None)
    for key in (key for key in data if key in keys):
        merged[key], origins[key] = data[key], (key,)


def _with_quant_file(config: FilledConfig, file: Mapping[str, Any], path: Path) -> FilledConfig:
    """``config`` with the quantization config of ``hf_quant_config.json`` beside ``path``, which vLLM reads where
    config.json (``file``, as written: not a text config's lifted keys) gives none (ModelOpt 0.29 and before)."""
    if file.get(QUANTIZATION_KEY) is None:
        found = read_hf_quant_config(path)
        if found is not None:
            config[QUANTIZATION_KEY] = found
    return config


def model_family(config: Mapping[str, Any]) -> Family:
    if config.get("per_layer_config") not in (None, {}):  # {}: no field varies, every layer is the same
        raise ModelSpecError(
            "per_layer_config: a model whose layers differ (transformers' per-layer configs, from which vLLM sizes "
            "each layer) is not planned by kvpolicy", ("per_layer_config",), VALUE_NOT_ALLOWED,
            "plan a config whose layers share their fields",
        )
    if config.get("model_type") == "deepseek_v4" or "compress_ratios" in config:
        return "deepseek_v4"
    if config.get("model_type") in ("deepseek_v32", "glm_moe_dsa") or "index_topk" in config:
        raise ModelSpecError(
            f"model_type {config.get('model_type')!r}: sparse-attention models with an indexer "
            "other than DeepSeek-V4 are not planned by kvpolicy",
            ("model_type",) if config.get("model_type") in ("deepseek_v32", "glm_moe_dsa") else ("index_topk",),
        )
    if config.get("kv_lora_rank"):
        return "mla"
    return "standard"


def model_specs(config: Mapping[str, Any], settings: SpecSettings | None = None,
                on_attention: Callable[[], None] | None = None) -> ModelSpecs:
    """The per-layer specs vLLM 0.33 builds for this config (one rank, CUDA backends), or the refusal of the
    config or launch vLLM refuses first; ``on_attention`` runs where vLLM picks the attention backend."""
    settings = settings or SpecSettings()
    family = model_family(config)
    tp = settings.tensor_parallel_size
    kv = kv_dtype(config, settings.kv_cache_dtype, family)

    def attention(layer: int) -> None:  # vLLM picks the backend, then loads the layer's KV quantization
        if on_attention is not None:
            on_attention()
        check_attention_kv(config, kv, family, layer)

    try:
        # In vLLM's order: its config (the config class's window, the cache config's, the heads, then the
        # quantization method), then as a worker builds the model: a Qwen2/3 model's layer kinds, the embedding,
        # and layer by layer the attention and the MLP (model_build).
        check_window(config)
        check_heads(config, tp)
        check_quant_config(config)
        check_method_fields(config)
        check_act_dtype(config, model_dtype(config, settings.dtype), settings.dtype, dtype_key(config))
        if family == "standard":
            _standard_layer_windows(config, _layers(config))
        check_build(config, tp, split_kv_heads=family == "standard", on_attention=attention,
                    kv_layer=first_kv_layer(config, family))
        layers, block = _layers_of(family, config, settings, kv)
    except TypeError as exc:  # a value of a kind no check above expected: none known (fuzzed), kept for the unforeseen
        raise ModelSpecError(f"a value of the wrong kind in the model config ({exc})", ("model_type",), WRONG_TYPE,
                             "kvpolicy cannot tell which value: check the kinds of the config's values") from None
    if not layers:
        raise ModelSpecError("the config has no attention layers (num_hidden_layers is 0)", ("num_hidden_layers",))
    return ModelSpecs(family=family, block_size=block, layers=layers)


def mla_cuda_block_size(kv_cache_dtype: str) -> int:
    """The block size vLLM's MLA backend takes on a Hopper GPU without --block-size: FlashAttention's MLA
    (first choice, any multiple of 16, so vLLM's default 16) for a 16-bit cache, FlashMLA (64 only) for fp8."""
    return 64 if kv_cache_dtype in ("fp8", "fp8_e4m3") else 16


def _layers_of(family: Family, config: Mapping[str, Any], settings: SpecSettings,
               kv: KvDtype) -> tuple[dict[str, LayerSpec], int]:
    if family == "deepseek_v4":
        block = settings.block_size or 256
        layers = _deepseek_v4_layers(config, settings, block, kv)
    elif family == "mla":
        block = settings.block_size or mla_cuda_block_size(kv.layers)
        layers = _mla_layers(config, settings, block, kv)
    else:
        block = settings.block_size or 16
        layers = _standard_layers(config, settings, block, kv)
    return layers, block


def _layers(config: Mapping[str, Any]) -> int:
    n = _int(config, "num_hidden_layers")
    if n > MAX_LAYERS:
        raise ModelSpecError(f"num_hidden_layers is {n}, more than any model has (at most {MAX_LAYERS:,} planned)",
                             ("num_hidden_layers",))
    return n


def auto_dtype(config: Mapping[str, Any]) -> str:
    """The model dtype vLLM's ``--dtype auto`` picks on CUDA (compute capability 8.0 and up) and x86/Arm CPUs.

    vLLM (``_get_and_verify_dtype`` → ``_resolve_auto_dtype``) keeps a float16 or bfloat16 checkpoint as it is and
    serves anything else in the platform's preferred dtype, the first of its ``supported_dtypes``, bfloat16 on
    both: float32 (vLLM downcasts it), a config without a dtype (read as float32 when no weights say otherwise,
    and every mix of weight dtypes resolves to one of these too), and float16 for the models vLLM refuses it for
    (Gemma-2/3, GLM-4). transformers reads ``dtype`` before the older ``torch_dtype``."""
    return _auto_dtype(config)[0]


def auto_dtype_reason(config: Mapping[str, Any]) -> str:
    """Why ``--dtype auto`` serves this model in ``auto_dtype(config)``, in the plan's ``assumed`` words."""
    return _auto_dtype(config)[1]


def _auto_dtype(config: Mapping[str, Any]) -> tuple[str, str]:
    check_config_dtypes(config)
    key = dtype_key(config)
    name = config[key] if key is not None else None
    if name is None:
        return "bfloat16", "the config gives no dtype: float32, which vLLM serves in bfloat16"
    if name in ("float16", "half") and config.get("model_type") in FLOAT16_REFUSED_MODEL_TYPES:
        return "bfloat16", f"the checkpoint's float16, which vLLM refuses for {config.get('model_type')}: bfloat16"
    if name in ("float16", "half", "bfloat16"):
        return DTYPE_ALIASES.get(name, name), "the checkpoint's"
    if name in ("float32", "float"):
        return "bfloat16", "the checkpoint's float32, which vLLM serves in bfloat16"
    return "bfloat16", f"the checkpoint's {name}, which vLLM serves in bfloat16"


def check_config_dtypes(config: Mapping[str, Any]) -> None:
    """Refuse a dtype ``hf_dtype`` refuses in any config transformers builds from the file: the one vLLM reads
    (a multimodal wrapper's own where it gives one, else its text config's: ``load_config``) and, for a
    wrapper, each sub-config (``text_config``, ``vision_config``), which transformers loads with its own dtype.
    transformers fails on such a name as it loads the config, before vLLM checks the RoPE parameters."""
    for level in ("model", *WRAPPER_SUB_CONFIGS):
        refusal = dtype_refusal(config, level)
        if refusal is not None:
            raise refusal


def dtype_refusal(config: Mapping[str, Any], level: str) -> ModelSpecError | None:
    """The refusal of the dtype of one config transformers builds from the file, None where it reads it:
    ``"model"`` the one vLLM reads, or a multimodal wrapper's sub-config (``config_levels``)."""
    return refusal_at_level(config, level, partial(dtype_problem, shown=_shown))


def gives_own_dtype(config: Mapping[str, Any]) -> bool:
    """Whether a multimodal wrapper's file gives a dtype of its own (the one vLLM reads, ``load_config``), not
    its text config's lifted beside its fields."""
    origins: Mapping[str, Any] = getattr(config, "origins", {})
    return any(origins.get(key) == (key,) for key in DTYPE_KEYS if key in config)


def model_dtype(config: Mapping[str, Any], dtype: str = "auto") -> str:
    """The dtype vLLM serves the model in for ``--dtype dtype``: bfloat16, float16 or float32.

    ``auto`` is ``auto_dtype``; an explicit dtype is taken as it is (half is float16, float is float32), but
    float16 is refused for the model types vLLM refuses it for (``_check_valid_dtype``), and a config whose
    own dtype transformers cannot read is refused whatever ``--dtype`` says (ModelSpecError)."""
    served = auto_dtype(config)  # vLLM reads the checkpoint's dtype whatever --dtype says
    if dtype == "auto":
        return served
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name not in DTYPE_BYTES or dtype not in MODEL_DTYPES:
        raise ModelSpecError(f"--dtype {_shown(dtype)} is not one of vLLM's: {', '.join(MODEL_DTYPES)}")
    model_type = config.get("model_type")
    if name == "float16" and model_type in FLOAT16_REFUSED_MODEL_TYPES:
        raise ModelSpecError(
            f"--dtype {dtype}: vLLM refuses float16 for model_type {model_type!r} (numerical instability) at "
            "start-up; use bfloat16 or float32",
            ("model_type",), LAUNCH_REFUSED,
        )
    return name


def _kv_dtype_bytes(config: Mapping[str, Any], s: SpecSettings, kv: KvDtype) -> int:
    """Bytes per element of what the layers store (``kv.layers``: auto is the model's dtype)."""
    if kv.layers == "auto":
        return DTYPE_BYTES[model_dtype(config, s.dtype)]
    if kv.layers in FP8_KV_DTYPES:
        return 1
    if kv.layers in DTYPE_BYTES:
        return DTYPE_BYTES[kv.layers]
    raise ModelSpecError(
        f"--kv-cache-dtype {kv.flag!r} is not planned (known: auto, bfloat16, float16, {', '.join(FP8_KV_DTYPES)})"
    )


def _standard_layers(config: Mapping[str, Any], s: SpecSettings, block: int, kv: KvDtype) -> dict[str, LayerSpec]:
    n = _layers(config)
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    # vLLM's `head_dim or hidden_size // heads`: an absent or zero head_dim is derived (always, for Qwen2).
    cls = config_class(config)
    if config.get("head_dim") and not (cls is not None and cls.head_dim_from_hidden):
        head_dim = _int(config, "head_dim")
    else:
        head_dim = _int(config, "hidden_size") // max(heads, 1)
    dtype_bytes = _kv_dtype_bytes(config, s, kv)
    # vLLM's attention layers: max(1, total_kv_heads // tp) heads per rank (replicated
    # when there are fewer KV heads than ranks).
    kv_heads_per_rank = max(1, kv_heads // s.tensor_parallel_size)
    windows = _standard_layer_windows(config, n)
    sw_block = s.sliding_window_block_size or block
    layers: dict[str, LayerSpec] = {}
    for i, window in enumerate(windows):
        common: dict[str, Any] = {
            "num_kv_heads": kv_heads_per_rank, "head_size": head_dim, "head_size_v": head_dim, "dtype_bytes": dtype_bytes
        }
        if window is not None:
            spec = LayerSpec(SpecKind.SLIDING_WINDOW, sw_block, sliding_window=window, pool="sliding_window", **common)
        else:
            spec = LayerSpec(SpecKind.FULL, block, pool="full", **common)
        layers[f"model.layers.{i}"] = spec
    return layers


def _standard_layer_windows(config: Mapping[str, Any], n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM gives it (``_given_windows``); a negative one refused."""
    windows = _given_windows(config, n)
    layer = next((i for i, w in enumerate(windows) if w is not None and w < 0), None)
    if layer is not None:
        # vLLM starts with it, but its KV arithmetic then counts negative tokens: a negative concurrency, or a
        # division by zero at start-up, depending on --max-model-len. Nothing to plan.
        raise ModelSpecError(
            f"sliding_window {windows[layer]}: layer {layer} would take a negative window, with which vLLM's KV "
            "cache arithmetic counts negative tokens (a negative concurrency, or a division by zero at start-up)",
            ("sliding_window",), VALUE_NOT_ALLOWED, "write the window as a positive number of tokens, or null for none")
    return windows


def _given_windows(config: Mapping[str, Any], n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM's model class for the config's model type gives it
    (``class_defaults``: the config's own window from ``layer_types`` one by one, all alike the model-level window,
    or every other layer the config's own; ``sliding_window`` says which windows vLLM takes as they are); for a
    model type the plan does not know, as ``layer_types`` says, and without it a window is refused (the class
    decides)."""
    named = _named_layer_kinds(config, n)
    cls = config_class(config)
    window = config.get("sliding_window")
    if cls is None:
        if named is not None:
            first = next((i for i, k in enumerate(named) if k == "sliding"), None)
            if first is not None and not (is_int(window) and window != 0):  # what the class would make of it is its own
                raise ModelSpecError(f"layer {first} is sliding_attention but sliding_window is {_shown(window)}",
                                     ("sliding_window",), int_code(config, "sliding_window"))
            return [window if k == "sliding" else None for k in named]
        if window and config.get("use_sliding_window", True):
            raise ModelSpecError(
                "the config sets sliding_window without layer_types, so which layers slide depends on "
                "the model class; add a layer_types list (full_attention / sliding_attention per layer)",
                ("layer_types",), MISSING_FIELD,
            )
        return [None] * n
    # The layers given no window of their own take the model-level one (CacheConfig.sliding_window).
    model_level = model_level_window(config)
    if cls.windows == "even_layers":  # the odd ones take the model-level window
        return [layer_window(config, i) if i % 2 == 0 else model_level for i in range(n)]
    if cls.windows == "model_level":
        layers = config.get("num_hidden_layers")
        if named is not None and len(set(named)) > 1 and config.get("max_window_layers") != layers:
            raise ModelSpecError(
                f"layer_types mix sliding and full attention, which vLLM's {config.get('model_type')} model refuses "
                f"at start-up unless max_window_layers ({_shown(config.get('max_window_layers'))}) is "
                f"num_hidden_layers ({layers}); its layers all take the model's one window or none",
                # layer_types as the file gives it, or as the class derives it from max_window_layers
                ("layer_types",) if class_default(config, "layer_types") is None else ("max_window_layers",),
            )
        return [model_level] * n
    if named is None:
        return [model_level] * n
    # A layer whose own window is none (null, 0) falls back to the model-level one, itself none then.
    return [layer_window(config, i) if k == "sliding" else None for i, k in enumerate(named)]


def _named_layer_kinds(config: Mapping[str, Any], n: int) -> list[Literal["full", "sliding"]] | None:
    """``layer_types`` as full/sliding per layer (the first ``n``), or None without it."""
    types = config.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) < n:
        raise ModelSpecError(f"layer_types must list {n} entries (num_hidden_layers), got {_shown(types)}",
                             ("layer_types",), VALUE_NOT_ALLOWED if isinstance(types, list) else WRONG_TYPE)
    kinds: list[Literal["full", "sliding"]] = []
    for i, t in enumerate(types[:n]):
        if t == "full_attention":
            kinds.append("full")
        elif t == "sliding_attention":
            kinds.append("sliding")
        else:
            raise ModelSpecError(
                f"layer_types[{i}] is {_shown(t)}: kvpolicy plans full_attention and sliding_attention "
                "layers only (no linear attention, Mamba or chunked-local layers)",
                ("layer_types", i), VALUE_NOT_ALLOWED if isinstance(t, str) else WRONG_TYPE,
            )
    return kinds


def _mla_layers(config: Mapping[str, Any], s: SpecSettings, block: int, kv: KvDtype) -> dict[str, LayerSpec]:
    n = _layers(config)
    latent = _int(config, "kv_lora_rank") + _int(config, "qk_rope_head_dim")
    dtype_bytes = _kv_dtype_bytes(config, s, kv)
    spec = LayerSpec(
        SpecKind.MLA,
        block,
        num_kv_heads=1,
        head_size=latent,
        dtype_bytes=dtype_bytes,
        cache_dtype=kv.layers,
        pool="mla",
    )
    return {f"model.layers.{i}": spec for i in range(n)}


def deepseek_v4_ratios(config: Mapping[str, Any]) -> list[int]:
    """Compression ratio per layer (0: sliding only, 4: CSA, 128: HCA)."""
    n = _layers(config)
    ratios = config.get("compress_ratios")
    key: str = "compress_ratios"
    if ratios is None:
        ratios, key = _ratios_of_layer_types(config), "layer_types"
    if not isinstance(ratios, list) or len(ratios) < n:
        raise ModelSpecError(f"compress_ratios must list at least {n} entries (num_hidden_layers)", (key,),
                             VALUE_NOT_ALLOWED if isinstance(ratios, list) else WRONG_TYPE)
    ratios = list(ratios[:n])  # the last entry of the released configs is the MTP layer
    bad = sorted({repr(r) for r in ratios if type(r) is not int or r not in (0, 1, 4, 128)})
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        first = next(i for i, r in enumerate(ratios) if type(r) is not int or r not in (0, 1, 4, 128))
        raise ModelSpecError(f"compress_ratios: vLLM's DeepSeek-V4 supports 0, 4 and 128, got {shown}",
                             _ratio_key(config, key, first), VALUE_NOT_ALLOWED if is_int(ratios[first]) else WRONG_TYPE)
    return [0 if r == 1 else r for r in ratios]


def _ratios_of_layer_types(config: Mapping[str, Any]) -> list[Any]:
    """The ratios ``layer_types`` gives layer by layer, at the rates ``compress_rates`` sets (else the defaults)."""
    types = config.get("layer_types")
    given = config.get("compress_rates") or {}
    if not isinstance(given, dict):
        raise ModelSpecError(f"compress_rates must map layer types to ratios, got {_shown(given)}",
                             ("compress_rates",), WRONG_TYPE)
    rates = {**V4_DEFAULT_COMPRESS_RATES, **given}
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        where: tuple[str | int, ...] = ("compress_ratios",) if types is None else ("layer_types",)
        if isinstance(types, list):  # the first entry that is no name
            where = ("layer_types", next(i for i, t in enumerate(types) if not isinstance(t, str)))
        raise ModelSpecError("a DeepSeek-V4 config needs compress_ratios or layer_types (a list of names)", where,
                             MISSING_FIELD if types is None else WRONG_TYPE)
    unknown = next((i for i, t in enumerate(types) if t not in V4_LAYER_TYPE_RATIO), None)
    if unknown is not None:
        raise ModelSpecError(f"layer_types: unknown DeepSeek-V4 layer type {types[unknown]!r}", ("layer_types", unknown))
    return [rates.get(t, 0) for t in types]


def _ratio_key(config: Mapping[str, Any], key: str, layer: int) -> tuple[str | int, ...]:
    """Where layer ``layer``'s ratio is written: in ``compress_ratios``, or the rate of its layer type."""
    if key == "compress_ratios":
        return ("compress_ratios", layer)
    kind = config["layer_types"][layer]
    return ("compress_rates", kind) if kind in (config.get("compress_rates") or {}) else ("layer_types", layer)


def _deepseek_v4_layers(config: Mapping[str, Any], s: SpecSettings, block: int, kv: KvDtype) -> dict[str, LayerSpec]:
    if kv.layers not in ("auto", *FP8_KV_DTYPES):
        raise ModelSpecError(
            f"{kv.shown}: DeepSeek-V4 on vLLM's FlashMLA path stores fp8_ds_mla "
            "(auto or fp8); the bf16 FlashInfer path is not planned"
        )
    head_dim = _int(config, "head_dim", 512)
    window = _v4_window(config)
    index_head_dim = _int(config, "index_head_dim", 128)
    ratios = deepseek_v4_ratios(config)
    _check_v4_compressors(ratios, head_dim, index_head_dim, s.indexer_kv_dtype)
    if s.indexer_kv_dtype == "mxfp4":
        index_bytes = index_head_dim // 2 + index_head_dim // MXFP4_BLOCK
    else:
        index_bytes = index_head_dim + index_head_dim // FP8_INDEXER_QUANT_BLOCK * 4
    packed: dict[str, Any] = {
        "num_kv_heads": 1,
        "head_size": head_dim,
        "dtype_bytes": 1,
        "state_content_bytes": V4_PACKED_BYTES_PER_TOKEN,
        "alignment": V4_FP8_DS_MLA_ALIGNMENT,
        "model_version": "deepseek_v4",
        "cache_dtype": "fp8_ds_mla",
    }
    layers: dict[str, LayerSpec] = {}
    for i, ratio in enumerate(ratios):
        prefix = f"model.layers.{i}.attn"
        # Insertion order is the order vLLM's modules register (DeepseekV4Attention
        # builds the indexer first, then its SWA cache, itself, then its compressor).
        if ratio == 4:
            layers[f"{prefix}.indexer.k_cache"] = LayerSpec(
                SpecKind.MLA,
                block,
                num_kv_heads=1,
                head_size=index_bytes,
                dtype_bytes=1,
                tokens_per_state=ratio,
                alignment=V4_FP8_DS_MLA_ALIGNMENT,
                pool="indexer",
            )
            layers[f"{prefix}.indexer.compressor.state_cache"] = _v4_state(ratio, index_head_dim, "indexer")
        layers[f"{prefix}.swa_cache"] = LayerSpec(
            SpecKind.SLIDING_WINDOW_MLA, V4_SWA_BLOCK_SIZE, sliding_window=window, pool="swa", **packed
        )
        if ratio == 0:
            continue
        layers[prefix] = LayerSpec(
            SpecKind.MLA, block, tokens_per_state=ratio, pool="c4" if ratio == 4 else "c128", **packed
        )
        layers[f"{prefix}.compressor.state_cache"] = _v4_state(ratio, head_dim, f"c{ratio}")
    return layers


def _v4_window(config: Mapping[str, Any]) -> int:
    """DeepSeek-V4's window: its config class takes a whole number only (no null), and vLLM turning a window of 0
    off (to null) makes the class refuse it too, as vLLM builds its config."""
    window = config.get("sliding_window", 128)  # a config not filled by its class: the class's default
    if window is None:
        raise ModelSpecError("sliding_window null: DeepseekV4Config takes a whole number only, so transformers "
                             "refuses the config and vLLM cannot load it", ("sliding_window",), WRONG_TYPE,
                             "write the window as a whole number of tokens (128 in DeepSeek-V4's own configs)")
    if is_int(window) and window == 0:
        raise ModelSpecError("sliding_window 0: vLLM turns a window of 0 off (null), which DeepseekV4Config refuses, "
                             "so vLLM cannot start", ("sliding_window",), VALUE_NOT_ALLOWED,
                             "write the window as a whole number of tokens (128 in DeepSeek-V4's own configs)")
    return _int(config, "sliding_window", 128)


V4_COMPRESSOR_HEAD_DIMS = (128, 512)
"""Head sizes vLLM's DeepSeek-V4 compressor quantizes and caches (its fused quant+cache kernels)."""


def _check_v4_compressors(ratios: list[int], head_dim: int, index_head_dim: int, indexer_kv_dtype: str) -> None:
    """Refuse head sizes vLLM's compressors refuse at start-up, in the order it builds them (layer by layer, a
    ratio-4 layer's indexer before its attention): each must be 128 or 512, an MXFP4 indexer's 128."""
    for ratio in ratios:
        if ratio == 4:
            _check_v4_compressor("index_head_dim", index_head_dim, indexer_kv_dtype == "mxfp4")
        if ratio:
            _check_v4_compressor("head_dim", head_dim, False)


def _check_v4_compressor(key: str, size: int, mxfp4: bool) -> None:
    if size == 512 and mxfp4:
        raise ModelSpecError(
            f"--indexer-kv-dtype mxfp4 with {key} 512: vLLM's MXFP4 indexer cache takes index_head_dim 128 only; "
            "use --indexer-kv-dtype fp8",
            (key,), LAUNCH_REFUSED,
        )
    if size not in V4_COMPRESSOR_HEAD_DIMS:
        raise ModelSpecError(
            f"{key} {size}: vLLM's DeepSeek-V4 compressor caches only head sizes 128 and 512 "
            f"(\"Unsupported head_dim for fused quant+cache\"); this config cannot start",
            (key,),
        )


def _v4_state(ratio: int, head_dim: int, part: str) -> LayerSpec:
    """A compressor's (kv, score) state ring: ``CompressorStateCache.get_kv_cache_spec``."""
    overlap = 2 if ratio == 4 else 1
    return LayerSpec(
        SpecKind.SLIDING_WINDOW_MLA,
        V4_STATE_BLOCK_SIZE[ratio],
        num_kv_heads=1,
        head_size=2 * overlap * head_dim,
        dtype_bytes=V4_STATE_DTYPE_BYTES,
        sliding_window=overlap * ratio,
        alignment=V4_FP8_DS_MLA_ALIGNMENT,
        pool="compressor_state",
        part=part,
    )
