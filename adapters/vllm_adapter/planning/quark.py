"""What vLLM's Quark config (``QuarkConfig``, ``quant_method: quark``) does to the KV cache; vLLM 0.32 and 0.33
run the same code for it (tests/vllm/test_vllm_quark.py):

- **Nothing under ``--kv-cache-dtype auto``**: a KV scheme in ``export.kv_cache_group`` does not make the cache
  fp8 (QuarkConfig has no ``kv_cache_scheme`` for ``Attention`` to read, and the cache config reads ModelOpt's
  KV algorithm only). Every layer stores the flag's dtype, excluded or not.
- **The config** (``QuarkConfig.from_config``, as vLLM builds its config): it needs ``export``; its
  ``kv_cache_group`` is a list (no list: a TypeError), and where not empty, the ``layer_quant_config`` entries it
  names (exactly or by fnmatch pattern) must exist and share one ``output_tensors``, not null: the KV config.
- **Each standard attention layer** (``get_quant_method``; vLLM's MLA and DeepSeek-V4 attention are no
  ``Attention`` and get nothing): unless ``exclude`` names the layer, ``QuarkKVCacheMethod``, which refuses a KV
  config other than ``fp8_e4m3`` ``per_tensor``; then the layer refuses an explicit ``fp8_e5m2`` ("not supported
  with fp8 checkpoints"). An excluded attention layer gets no method and takes fp8_e5m2 or any KV config; since
  vLLM builds layer by layer, a model is refused at its first attention layer that is not excluded.
- **``exclude``** names a layer by its vLLM name (``model.layers.N.self_attn.attn``) exactly, or with a
  ``re:PATTERN`` entry where ``match`` finds the pattern at the name's start; shell globs match nothing. The
  model class's renames apply to the entries first (gpt-oss: ``.self_attn.`` → ``.attn.``). vLLM reads the list
  at every layer it builds: null (or absent), or not iterable, fails the first one (a TypeError). vLLM compiles
  and matches the patterns with the ``regex`` package, and so does the plan: it reads some patterns otherwise
  than ``re`` does (POSIX classes, Unicode properties, fuzzy matching).

Pure code (no torch, no vllm).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import regex
from kvpolicy.document_codes import MISSING_FIELD, VALUE_NOT_ALLOWED, WRONG_TYPE

from .class_defaults import config_class
from .config_values import ModelSpecError
from .config_values import shown as _shown

if TYPE_CHECKING:
    from .quant_config import Quantization

QUARK = "quark"
KV_CONFIG = {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}
"""The one KV config ``QuarkKVCacheMethod`` takes, in the order it checks its keys."""
EXCLUDE_RENAMES = {"gpt_oss": (".self_attn.", ".attn.")}
"""A model type → the substring its vLLM model class renames in ``exclude``'s entries (``hf_to_vllm_mapper``; the
other text models the plan knows rename nothing there)."""


def is_quark(quant: Quantization | None) -> bool:
    return quant is not None and quant.method == QUARK


def check_quark_config(quant: Quantization) -> None:
    """Refuse the Quark config ``QuarkConfig.from_config`` refuses (ModelSpecError), and an ``exclude`` that
    vLLM cannot read as it builds the first layer (after its config: the checks come in that order)."""
    kv_config(quant)
    exclude_patterns(quant)


def kv_config(quant: Quantization) -> Any:
    """The KV config (``output_tensors``) of the ``layer_quant_config`` entries ``export.kv_cache_group`` names,
    as vLLM takes it (None: an empty group); ModelSpecError where vLLM refuses the config."""
    export = quant.data.get("export")
    if not isinstance(export, Mapping):
        raise ModelSpecError(f"{quant.named}: vLLM's Quark config needs an export object (\"The export key should "
                             f"be included\"), got {_shown(export)}", quant.at("export"),
                             MISSING_FIELD if export is None else WRONG_TYPE)
    group = export.get("kv_cache_group")
    if not isinstance(group, list):
        raise ModelSpecError(f"{quant.named}.export.kv_cache_group must be a list (vLLM takes its length), got "
                             f"{_shown(group)}", quant.at("export", "kv_cache_group"),
                             MISSING_FIELD if group is None else WRONG_TYPE)
    if not group:
        return None
    return _group_kv_config(quant, group)


def _group_kv_config(quant: Quantization, group: list[Any]) -> Any:
    layers = quant.data.get("layer_quant_config")
    if not isinstance(layers, Mapping) or not all(isinstance(p, str) for p in group):
        raise ModelSpecError(f"{quant.named}: a kv_cache_group needs a layer_quant_config object and names only, "
                             f"got {_shown(layers)} and {_shown(group)}", quant.at("layer_quant_config"), WRONG_TYPE)
    named = [entry for name, entry in layers.items() if any(fnmatch.fnmatchcase(name, p) for p in group)]
    group_key = quant.at("export", "kv_cache_group")
    if not named:
        raise ModelSpecError(f"{quant.named}.export.kv_cache_group {_shown(group)} names no layer_quant_config "
                             "entry, and vLLM refuses the Quark config (\"no kv_cache quantization settings were "
                             "found\")", group_key)
    if not all(isinstance(e, Mapping) and "output_tensors" in e for e in named):
        raise ModelSpecError(f"{quant.named}: the layer_quant_config entries kv_cache_group names must be objects "
                             "with output_tensors, which vLLM reads as the KV config", group_key, WRONG_TYPE)
    kv = named[0]["output_tensors"]
    if not all(_same(e["output_tensors"], kv) for e in named):
        raise ModelSpecError(f"{quant.named}: the layer_quant_config entries kv_cache_group names give different "
                             "output_tensors, and vLLM refuses the Quark config (\"The quantization method used "
                             "for kv_cache should be the same\")", group_key)
    if kv is None:
        raise ModelSpecError(f"{quant.named}: the layer_quant_config entries kv_cache_group names give no "
                             "output_tensors (null), and vLLM refuses the Quark config (\"The kv_cache quantization "
                             "configuration is empty\")", group_key, MISSING_FIELD)
    return kv


def _same(each: Any, first: Any) -> bool:
    """Whether vLLM takes two KV configs for the same (``deep_compare``): the same types throughout, objects with
    the same keys, lists item by item as far as ``each`` goes (a longer one fails it)."""
    if type(each) is not type(first):
        return False
    if isinstance(each, dict):
        return each.keys() == first.keys() and all(_same(each[k], first[k]) for k in each)
    if isinstance(each, list):
        return len(each) <= len(first) and all(_same(a, b) for a, b in zip(each, first))
    return bool(each == first)


def exclude_patterns(quant: Quantization) -> list[str]:
    """``exclude`` as vLLM matches layer names against it, after the model class's renames; ModelSpecError where
    vLLM fails on it (null or no list: not iterable; an entry that is no name)."""
    exclude = quant.data.get("exclude")
    if isinstance(exclude, str | Mapping):  # vLLM iterates it: a name's letters, an object's keys
        return list(exclude)
    if not isinstance(exclude, list):
        raise ModelSpecError(f"{quant.named}.exclude must be a list of layer names (vLLM fails on "
                             f"{_shown(exclude)} as it builds the model)", quant.at("exclude"),
                             MISSING_FIELD if exclude is None else WRONG_TYPE)
    for i, entry in enumerate(exclude):
        if not isinstance(entry, str):
            raise ModelSpecError(f"{quant.named}.exclude[{i}] must be a layer name (vLLM fails on "
                                 f"{_shown(entry)} as it builds the model)", _index(quant.at("exclude"), i), WRONG_TYPE)
        _check_pattern(quant, entry, i)
    return exclude


def _check_pattern(quant: Quantization, entry: str, i: int) -> None:
    """vLLM compiles a ``re:`` entry as it matches the first layer against it."""
    if not entry.startswith("re:"):
        return
    try:
        regex.compile(entry[3:])
    except regex.error as exc:
        raise ModelSpecError(f"{quant.named}.exclude[{i}] {_shown(entry)}: no regular expression ({exc}), and vLLM "
                             "fails on it as it builds the model", _index(quant.at("exclude"), i),
                             VALUE_NOT_ALLOWED) from None


def _index(key: tuple[str, ...] | None, i: int) -> tuple[str | int, ...] | None:
    return None if key is None else (*key, i)


def excludes(quant: Quantization, config: Mapping[str, Any], layer: str) -> bool:
    """Whether ``exclude`` names the vLLM layer ``layer`` (exactly, or ``re:`` at its start)."""
    old, new = EXCLUDE_RENAMES.get(str(config.get("model_type")), ("", ""))
    for entry in exclude_patterns(quant):
        if old:
            entry = entry.replace(old, new, 1)
        if (entry.startswith("re:") and regex.match(entry[3:], layer)) or entry == layer:
            return True
    return False


def attention_name(config: Mapping[str, Any], layer: int) -> str:
    """vLLM's name of layer ``layer``'s standard attention (its ``Attention`` module)."""
    cls = config_class(config)
    return f"model.layers.{layer}.{cls.attention if cls is not None else 'self_attn'}.attn"


def first_kv_layer(quant: Quantization, config: Mapping[str, Any], layers: int) -> int | None:
    """The first of ``layers`` standard attention layers that ``exclude`` leaves to Quark's KV cache method
    (None: it excludes them all)."""
    return next((i for i in range(layers) if not excludes(quant, config, attention_name(config, i))), None)


def check_kv_config(quant: Quantization) -> None:
    """Refuse a KV config ``QuarkKVCacheMethod`` does not take, as vLLM builds an attention layer not excluded."""
    kv = kv_config(quant)
    if kv is None:
        return
    if not isinstance(kv, Mapping):
        raise ModelSpecError(f"{quant.named}: the KV config of kv_cache_group is {_shown(kv)}, not an object, and "
                             "vLLM fails on it as it builds its first attention layer that exclude does not name",
                             quant.at("export", "kv_cache_group"), WRONG_TYPE)
    for key, taken in KV_CONFIG.items():
        if kv.get(key) != taken:
            raise ModelSpecError(
                f"{quant.named}: the KV config of kv_cache_group has {key} {_shown(kv.get(key))}; vLLM's Quark KV "
                f"cache takes {key} {taken} only, and refuses the model as it builds its first attention layer that "
                "exclude does not name", quant.at("export", "kv_cache_group"), VALUE_NOT_ALLOWED)
