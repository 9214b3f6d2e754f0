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

tests/vllm/test_vllm_base_config.py and tests/sglang/test_sglang_base_config.py hold the plans to the classes
and to each engine. Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
