"""What every transformers 5.19 config class refuses as it builds a config, whatever the model: the keys its base
class (``PreTrainedConfig``) reads or sets for itself. vLLM 0.33 and SGLang 0.5.23 build the config with such a
class, so neither starts with these faults; the plans refuse them at their keys.

- ``id2label`` (the labels of a classification head, which neither engine builds for generation) is read as an
  object whose keys are label ids: anything else fails (``.items()``), and so does a key that ``int()`` cannot
  read (JSON keys are strings: ``"0"``, ``" 1"`` and ``"1_0"`` are read, ``"a"`` is not).
- ``num_labels``, where given, sets that many labels (``range``): a whole number only (``true`` is 1; null, a
  float or a string fail), but where ``id2label`` is given, it is set after the rest of the config and only
  where it differs from the count of labels (``2.0`` beside two labels passes). Without ``id2label`` a config
  has ``num_labels`` labels, 2 if it gives none; with one, as many as its distinct ids.
- ``problem_type: "single_label_classification"`` needs two labels or more.
- ``READ_ONLY``: keys the class derives and cannot set (``AttributeError``).
- ``layer_types``, ``mlp_layer_types``, ``mtp_layer_types``: each class renames the legacy names of the first and
  the last as it builds the config (``renamed_layer_types_problem``), then its validator requires every entry
  of the first two to be a layer type transformers knows and one entry per layer (``layer_types_problem``; it
  looks at ``mlp_layer_types`` only beside a ``layer_types``). A class may check them its own way instead.

tests/vllm/test_vllm_base_config.py and tests/sglang/test_sglang_base_config.py hold the plans to the classes
and to each engine (the layer types: the SGLang plan's only; the vLLM plan checks those of the models that
read them its own way). Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE

if TYPE_CHECKING:
    from kvpolicy.document_codes import DocumentCode

READ_ONLY = ("use_return_dict", "is_heterogeneous", "per_layer_attributes")
"""Properties of the base class without a setter: a config that gives one cannot be built."""
LABEL_KEYS = ("id2label", "num_labels", "problem_type")
BASE_KEYS = (*LABEL_KEYS, *READ_ONLY)
"""The keys this module reads: each config object transformers builds reads its own."""
SINGLE_LABEL = "single_label_classification"
NO_HEAD = "vLLM and SGLang serve no classification head from it"


@dataclass(frozen=True)
class BaseProblem:
    """Why the plans refuse a config's base keys: where (a key, or ``id2label`` and one of its keys), the
    diagnostic's code, message and hint."""

    path: tuple[str, ...]
    code: DocumentCode
    message: str
    hint: str


def base_problem(config: Mapping[str, Any], shown: Callable[[Any], str] = repr) -> BaseProblem | None:
    """The first fault of ``config``'s own base keys in the order its class meets them, None if it has none:
    the labels as it builds the config, then the keys it sets after the rest, in the file's order; ``shown``
    writes a value as the caller's other messages do."""
    labels = _labels(config, shown)
    return labels if isinstance(labels, BaseProblem) else _set_problem(config, labels, shown)


def _labels(config: Mapping[str, Any], shown: Callable[[Any], str]) -> int | BaseProblem:
    """How many labels the class builds the config with, or why it cannot."""
    id2label = config.get("id2label")
    if id2label is None:
        if "num_labels" in config and not _is_whole(config["num_labels"]):
            return _num_labels(config["num_labels"], shown)
        labels = max(int(config.get("num_labels", 2)), 0)
    else:
        if not isinstance(id2label, Mapping):
            return BaseProblem(("id2label",), WRONG_TYPE,
                               f"id2label {shown(id2label)}: transformers reads the labels as an object of label ids "
                               "to names, so it cannot build the config", f"leave id2label out ({NO_HEAD})")
        ids = set()
        for key in id2label:
            label_id = _label_id(key)
            if label_id is None:
                return BaseProblem(("id2label", key), VALUE_NOT_ALLOWED,
                                   f"id2label key {shown(key)}: transformers reads each label id as a whole number "
                                   "(int()), so it cannot build the config", 'write label ids as "0", "1", ...')
            ids.add(label_id)
        labels = len(ids)
    if config.get("problem_type") == SINGLE_LABEL and labels == 1:
        return BaseProblem(("problem_type",), VALUE_NOT_ALLOWED,
                           f"problem_type {shown(SINGLE_LABEL)} with one label: transformers requires two or more "
                           "for it, so it cannot build the config", f"leave problem_type out ({NO_HEAD})")
    return labels


def _set_problem(config: Mapping[str, Any], labels: int, shown: Callable[[Any], str]) -> BaseProblem | None:
    """The first key the class cannot set after the rest of the config: one it derives, or a ``num_labels``
    other than its count of labels that is no whole number (it builds that many labels anew)."""
    for key, value in config.items():
        if key in READ_ONLY:
            hint = "leave it out; return_dict sets it" if key == "use_return_dict" else "leave it out"
            return BaseProblem((key,), VALUE_NOT_ALLOWED, f"{key}: transformers derives it and cannot set it, so it "
                               "cannot build a config that gives it", hint)
        if key == "num_labels" and value != labels and not _is_whole(value):
            return _num_labels(value, shown)
    return None


ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "window_attention",
                         "indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                         "minimax_m3_sparse", "conv", "moe", "hybrid", "hybrid_sliding", "linear_attention")
"""transformers 5.19's ``ALLOWED_ATTN_LAYER_TYPES``: the entries a ``layer_types`` may hold."""
MLP_LAYER_TYPES = ("sparse", "dense")
"""transformers 5.19's ``ALLOWED_MLP_LAYER_TYPES``: the entries an ``mlp_layer_types`` may hold."""
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention",
                      "deepseek_sparse_attention": "indexed_attention", "qwen_sparse_attention": "indexed_attention"}
"""The old names transformers renames in ``layer_types`` (and ``mtp_layer_types``) before it checks them."""


def renamed_layer_types_problem(config: Mapping[str, Any], shown: Callable[[Any], str] = repr) -> BaseProblem | None:
    """What stops transformers renaming the legacy names in ``layer_types`` and ``mtp_layer_types``, as every
    class does while it builds a config: a value it cannot iterate, an entry it cannot look up; None if nothing."""
    for key in ("layer_types", "mtp_layer_types"):
        value = config.get(key)
        if value is not None and (not _iterable(value) or not all(_hashable(entry) for entry in value)):
            return _layer_types(key, value, shown)
    return None


def layer_types_problem(config: Mapping[str, Any], layers: int | None,
                        shown: Callable[[Any], str] = repr) -> BaseProblem | None:
    """What the base class's validator refuses in the layer types (after ``renamed_layer_types_problem``), None if
    nothing: ``layer_types`` and, beside it, ``mlp_layer_types`` with an entry of no known type, or a count other
    than ``layers`` (the config's ``num_hidden_layers``). A class may check them its own way instead."""
    for key, allowed in (("layer_types", ATTENTION_LAYER_TYPES), ("mlp_layer_types", MLP_LAYER_TYPES)):
        value = config.get(key)
        if value is None:
            return None  # the validator stops at the first list not given
        if not _iterable(value):
            return _layer_types(key, value, shown)
        entries = renamed(value) if key == "layer_types" else list(value)
        unknown = unknown_layer_type(key, value, entries, allowed, shown)
        if unknown is not None:
            return unknown
        if layers is not None and layers != len(entries):
            return layer_count(key, len(entries), layers)
    return None


def renamed(value: Any) -> list[Any]:
    """The entries of a layer types value with the legacy names renamed."""
    return [LEGACY_LAYER_TYPES.get(entry, entry) for entry in value]


def unknown_layer_type(key: str, value: object, entries: Sequence[Any], allowed: tuple[str, ...],
                       shown: Callable[[Any], str]) -> BaseProblem | None:
    """The first of ``entries`` (``value``'s, as the class reads them) that is not ``allowed``, None if none."""
    index = next((index for index, entry in enumerate(entries) if entry not in allowed), None)
    if index is None:
        return None
    return BaseProblem((key, str(index)) if isinstance(value, list) else (key,), VALUE_NOT_ALLOWED,
                       f"{key} {shown(value)}: {shown(entries[index])} is no layer type transformers takes here "
                       f"({', '.join(allowed)}), so it cannot build the config",
                       "write one such layer type per layer, or leave the key out")


def layer_count(key: str, count: int, layers: int) -> BaseProblem:
    return BaseProblem((key,), VALUE_NOT_ALLOWED,
                       f"{key}: {count} entries where num_hidden_layers is {layers}: transformers requires one per "
                       "layer, so it cannot build the config", "write one layer type per layer, or leave the key out")


def _layer_types(key: str, value: object, shown: Callable[[Any], str]) -> BaseProblem:
    return BaseProblem((key,), WRONG_TYPE, f"{key} {shown(value)}: transformers reads a list of layer type names, so "
                       "it cannot build the config", "write one layer type name per layer, or leave the key out")


def _iterable(value: object) -> bool:
    return isinstance(value, (list, str, Mapping))  # what a JSON value iterates: a string by letters, an object by keys


def _hashable(value: object) -> bool:
    return not isinstance(value, (list, Mapping))


def _is_whole(value: object) -> bool:
    return isinstance(value, int)  # a bool is an int: true is one label


def _num_labels(value: object, shown: Callable[[Any], str]) -> BaseProblem:
    return BaseProblem(("num_labels",), WRONG_TYPE,
                       f"num_labels {shown(value)}: transformers sets that many labels, a whole number only, so it "
                       "cannot build the config", f"leave num_labels out ({NO_HEAD})")


def _label_id(key: str) -> int | None:
    try:
        return int(key)
    except ValueError:
        return None
