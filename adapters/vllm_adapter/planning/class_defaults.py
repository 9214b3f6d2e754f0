"""What a model's config class adds to a ``config.json`` that omits a key the plan reads.

vLLM never reads config.json as it is: transformers' config class for its ``model_type`` (or the
class vLLM registers for it) fills in every field the file omits, and derives some from others
(``head_dim`` from the hidden size, ``layer_types`` from a window pattern). The plan reads the file
without transformers (not a dependency of kvpolicy), so it keeps, per model type, the defaults of
the keys it reads: ``CONFIG_CLASSES``, checked against transformers' classes (as vLLM 0.33 resolves
them) by tests/vllm/test_vllm_class_defaults.py, so the table cannot drift from them.

For a model type the table does not know the file is read as it is, and where it lacks a key the
plan takes vLLM's own fallbacks (``hf_config``): right whenever the class defines no default of its
own for that key.

Also here, per model type, what vLLM's model class does with those values: how its layers take
their sliding window (``windows``): from ``layer_types`` one by one (Llama, Mistral, Gemma-2/3), or
all alike from the model-level window, which vLLM sets only when ``layer_types`` is absent or all
sliding (Qwen2/3, whose vLLM models refuse a mix unless ``max_window_layers`` covers every layer),
or on every other layer (gpt-oss, the others the model-level window); what it splits across
tensor-parallel ranks (``mlp``, ``replicates_kv_heads``; ``model_build``) and whether it reads
``head_dim``. tests/vllm/test_vllm_plan_random.py builds vLLM's models to check them. Pure code: no
transformers, no vllm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

if TYPE_CHECKING:
    from kvpolicy.json_text import JsonObjectFile

Windows = Literal["per_layer", "model_level", "even_layers"]
Mlp = Literal["dense", "experts", "deepseek"]

MAX_LAYERS = 100_000
"""More layers than any model has (the largest have a few hundred): a config past it is refused
before a spec is built for each layer (10**9 layers would take minutes, 10**20 overflow), and no
layer list is derived for it here."""


@dataclass(frozen=True)
class Derived:
    """A default computed from the other fields once they have theirs, for an absent key or an explicit null (the
    class's ``if x is None: x = ...``). A constant default applies to an absent key only: a null stays null."""

    rule: Callable[[Mapping[str, Any]], Any]
    why: str


def _kv_heads(c: Mapping[str, Any]) -> Any:
    return c.get("num_attention_heads")


def _hidden_per_head(c: Mapping[str, Any]) -> Any:
    heads, hidden = c.get("num_attention_heads"), c.get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        return hidden // heads
    return None


def _pattern(period: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], Any]:
    """Sliding attention on every layer but each ``period``-th (transformers' ``(i + 1) % period``)."""

    def rule(c: Mapping[str, Any]) -> Any:
        n, p = c.get("num_hidden_layers"), period(c)
        if not _layer_count(n) or not isinstance(p, int) or p <= 0:
            return None
        return ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(n)]

    return rule


def _qwen_layer_types(c: Mapping[str, Any]) -> Any:
    """Qwen2/3: sliding from ``max_window_layers`` on, when the (already nulled) window is set."""
    n, window, first = c.get("num_hidden_layers"), c.get("sliding_window"), c.get("max_window_layers")
    if not _layer_count(n) or not isinstance(first, int):
        return None
    return ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]


def _layer_count(n: Any) -> TypeGuard[int]:
    """A layer count a list can be derived for (what is not is refused later, by the plan)."""
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_LAYERS


def _qwen_window(c: Mapping[str, Any]) -> Any:
    """Qwen2/3 keep ``sliding_window`` only with ``use_sliding_window`` (their ``__post_init__``)."""
    return c.get("sliding_window") if c.get("use_sliding_window") else None


KV_HEADS = Derived(_kv_heads, "num_attention_heads")
HEAD_DIM = Derived(_hidden_per_head, "hidden_size // num_attention_heads")
EVERY_OTHER = Derived(_pattern(lambda c: 2), "sliding and full attention in turn, sliding first")
GEMMA3_PATTERN = Derived(_pattern(lambda c: c.get("sliding_window_pattern", 6)),
                         "every sliding_window_pattern-th layer (6) full, the others sliding")
QWEN_LAYER_TYPES = Derived(_qwen_layer_types, "sliding from max_window_layers on when the window is kept")


@dataclass(frozen=True)
class ConfigClass:
    """One config class: its name, the defaults of the keys the plan reads, its model's way with windows."""

    name: str
    defaults: dict[str, Any]
    """key → a constant, or a ``Derived``; applied in this order, constants first."""
    windows: Windows = "per_layer"
    adjust: dict[str, Derived] = field(default_factory=dict)
    """Fields the class recomputes whatever the file says (Qwen's window without use_sliding_window)."""
    mlp: Mlp | None = None
    """What vLLM's model splits across tensor-parallel ranks in each layer's MLP (``model_build``): a dense MLP of
    ``intermediate_size``, experts of ``intermediate_size`` (gpt-oss), DeepSeek's dense and MoE layers; None: not
    checked."""
    head_dim_from_hidden: bool = False
    """vLLM's model sizes its heads as hidden_size // num_attention_heads whatever head_dim says (Qwen2)."""
    typed_window: bool = True
    """The class declares ``sliding_window`` as ``int | None`` and refuses any other kind of value (transformers'
    strict check); Llama and DeepSeek-V2/V3 declare no such field and keep whatever the file says
    (``sliding_window``)."""
    replicates_kv_heads: bool = True
    """vLLM's attention keeps a copy of a KV head on each of several ranks when there are fewer KV heads than
    ranks; gpt-oss's gives each rank kv_heads // tp, none, and fails to start."""
    embedding: str = "model.embed_tokens"
    attention: str = "self_attn"
    """vLLM's names of the model's embedding and of a layer's attention (``model_build``'s refusals name them; an
    embedding vLLM builds without a name of its own is the model's, ``model``)."""


_QWEN2: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
}
_QWEN_ADJUST = {"sliding_window": Derived(_qwen_window, "kept only with use_sliding_window")}
_GEMMA3_TEXT = ConfigClass("Gemma3TextConfig", {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
    "sliding_window": 4096, "layer_types": GEMMA3_PATTERN,
}, mlp="dense")
_DEEPSEEK_V3 = ConfigClass("DeepseekV3Config", {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "first_k_dense_replace": 3,
    "max_position_embeddings": 4096,
}, mlp="deepseek", typed_window=False)

CONFIG_CLASSES: dict[str, ConfigClass] = {
    "llama": ConfigClass("LlamaConfig", {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 2048,
        "head_dim": HEAD_DIM,
    }, mlp="dense", embedding="model", typed_window=False),
    "mistral": ConfigClass("MistralConfig", {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": HEAD_DIM,
        "max_position_embeddings": 131072, "sliding_window": 4096,
    }, mlp="dense", embedding="model"),
    "qwen2": ConfigClass("Qwen2Config", {**_QWEN2, "layer_types": QWEN_LAYER_TYPES}, "model_level", _QWEN_ADJUST,
                         mlp="dense", head_dim_from_hidden=True),
    "qwen3": ConfigClass("Qwen3Config", {**_QWEN2, "head_dim": 128, "layer_types": QWEN_LAYER_TYPES},
                         "model_level", _QWEN_ADJUST, mlp="dense"),
    "gemma2": ConfigClass("Gemma2Config", {
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
        "sliding_window": 4096, "layer_types": EVERY_OTHER,
    }, mlp="dense", embedding="model"),
    "gemma3_text": _GEMMA3_TEXT,
    "gemma3": _GEMMA3_TEXT,  # the multimodal wrapper: its text config is a Gemma3TextConfig
    "gpt_oss": ConfigClass("GptOssConfig", {
        "num_hidden_layers": 36, "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
        "max_position_embeddings": 131072, "layer_types": EVERY_OTHER,
    }, "even_layers", mlp="experts", replicates_kv_heads=False, embedding="model", attention="attn"),
    "deepseek_v2": ConfigClass("DeepseekV2Config", {
        "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 2048,
        "first_k_dense_replace": 0, "kv_lora_rank": 512, "n_routed_experts": 64, "n_shared_experts": 2,
        "qk_rope_head_dim": 64, "moe_intermediate_size": 1407,
    }, mlp="deepseek", typed_window=False),
    "deepseek_v3": _DEEPSEEK_V3,
    "kimi_k2": _DEEPSEEK_V3,  # vLLM registers DeepseekV3Config for it
    "deepseek_v4": ConfigClass("DeepseekV4Config", {
        "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "n_routed_experts": 256,
        "n_shared_experts": 1, "max_position_embeddings": 1048576, "sliding_window": 128, "index_head_dim": 128,
    }),
}
"""Model type → its config class in transformers 5.19 as vLLM 0.33 resolves it (vLLM registers DeepseekV3Config
for kimi_k2; vLLM 0.32 registers a DeepseekV4Config of its own, whose one default among these keys is
max_position_embeddings, the same). A null the class turns into a default (a null ``num_key_value_heads`` is
``num_attention_heads``, a null ``head_dim`` is derived) the plan's own fallbacks take alike (``hf_config``)."""


WRAPPER_CLASSES: dict[str, str] = {"gemma3": "Gemma3Config"}
"""Model type of a multimodal wrapper → the class of the wrapper itself, which checks its own fields (its text
config is the class ``CONFIG_CLASSES`` names)."""
WRAPPER_SUB_CONFIGS = ("text_config", "vision_config")
"""The sub-configs of a multimodal wrapper (Gemma-3's) that transformers builds as configs of their own, in the
order it builds them (after checking the wrapper's own fields)."""


def config_class(config: Mapping[str, Any]) -> ConfigClass | None:
    model_type = config.get("model_type")
    return CONFIG_CLASSES.get(model_type) if isinstance(model_type, str) else None


ConfigKey = tuple[str | int, ...]
"""A value's path in a config: as the plan reads it (``("layer_types", 3)``; under ``text_config`` for a key read
from a multimodal config's text config alone), or as the file nests it."""


@dataclass(frozen=True)
class Source:
    """Where a value the plan read came from: the file (``path`` in it, or where a key it lacks would be), or
    the config class (``default_of``, its name; ``path`` empty), whose model type is at ``model_type`` in the
    file."""

    path: ConfigKey
    default_of: str | None = None
    model_type: ConfigKey = ()


class FilledConfig(dict[str, Any]):
    """A config with its class's defaults; ``class_defaults`` names each key the class gave (key → class),
    ``origins`` where each other key is in the file (``text_config``'s keys lifted beside the wrapper's: under
    it), ``home`` the object a key it lacks belongs in, ``document`` the file it was read from (None: not
    read from a file), ``as_written`` the file's own values of the keys the class recomputes (its type checks
    see them first)."""

    class_defaults: dict[str, str]

    def __init__(self, config: Mapping[str, Any], class_defaults: dict[str, str],
                 origins: dict[str, ConfigKey] | None = None, home: ConfigKey = (),
                 document: JsonObjectFile | None = None, as_written: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.class_defaults = class_defaults
        self.origins = origins if origins is not None else {k: (*home, k) for k in config if k not in class_defaults}
        self.home, self.document = home, document
        self.as_written = as_written or {}

    def source(self, key: ConfigKey) -> Source:
        """Where the value at ``key`` (a path as the plan reads it) came from."""
        head, rest = str(key[0]), key[1:]
        inner = self.get(head)
        if rest and isinstance(inner, FilledConfig):  # a multimodal config's text config, filled by its class
            return inner.source(rest)
        if head in self.class_defaults:
            return Source((), self.class_defaults[head], self.origins.get("model_type", ()))
        origin = self.origins.get(head, (*self.home, head))
        return Source((*origin, *rest))


def is_wrapper(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` is a multimodal wrapper read with its text config (``hf_config.load_config``)."""
    return isinstance(config, FilledConfig) and config.home == ("text_config",)


def with_class_defaults(config: Mapping[str, Any], home: ConfigKey = ()) -> FilledConfig:
    """``config`` with what its class adds: every key of the table it omits, and the fields the class recomputes;
    a model type the table does not know comes back as it is. ``home``: where ``config`` is in its file."""
    cls = config_class(config)
    filled = dict(config)
    origins: dict[str, ConfigKey] = {k: (*home, k) for k in config}
    if cls is None:
        return FilledConfig(filled, {}, origins, home)
    given: dict[str, str] = {}
    as_written = {key: config[key] for key in cls.adjust if key in config}
    for key, default in cls.defaults.items():
        if not isinstance(default, Derived) and key not in filled:
            filled[key] = default
            given[key] = cls.name
    for key, adjust in cls.adjust.items():  # before what is derived from them, as the classes do
        filled[key] = adjust.rule(filled)
    for key, default in cls.defaults.items():
        if isinstance(default, Derived) and filled.get(key) is None:
            filled[key] = default.rule(filled)
            given[key] = cls.name
    return FilledConfig(filled, given, origins, home, as_written=as_written)


def as_written(config: Mapping[str, Any], key: str) -> Any:
    """``config[key]`` as the file gives it, before its class recomputed it (Qwen's window), or None."""
    if isinstance(config, FilledConfig) and key in config.as_written:
        return config.as_written[key]
    return config.get(key)


def class_default(config: Mapping[str, Any], key: str) -> str | None:
    """The class whose default ``config`` holds for ``key`` (None: the file gave it, or nobody did)."""
    return config.class_defaults.get(key) if isinstance(config, FilledConfig) else None
