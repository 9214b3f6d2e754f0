"""A checkpoint's quantization config as vLLM finds and reads it: where (config.json's ``quantization_config``,
``hf_quant_config.json`` beside it, a multimodal config's ``text_config``, an older ``compression_config``), and
its ``quant_method`` as vLLM normalises it (lower case, ``compressed_tensors`` → ``compressed-tensors``, a ModelOpt
export named by its ``producer`` given its method by its ``quant_algo``). What the config does to the KV cache is
``kv_dtype``'s and ``quark``'s; whether vLLM serves the method, ``quant_method``'s. Pure code (no torch, no vllm).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpolicy.document_codes import WRONG_TYPE

from .config_values import ConfigInvalid, ConfigUnreadable, ModelSpecError
from .config_values import shown as _shown

QUANTIZATION_KEY = "quantization_config"
COMPRESSION_KEY = "compression_config"
HF_QUANT_CONFIG = "hf_quant_config.json"
"""Where ModelOpt 0.29 and before kept the quantization config: beside config.json."""

MODELOPT_PRODUCER_METHODS = {
    "FP8": "modelopt", "FP8_PER_CHANNEL_PER_TOKEN": "modelopt", "FP8_PB_WO": "modelopt",
    "NVFP4": "modelopt_fp4", "MIXED_PRECISION": "modelopt_mixed",
}
"""The ``quant_method`` vLLM gives a ModelOpt export named by its producer, by its ``quant_algo`` (upper-cased);
0.32 knows no MIXED_PRECISION there."""

class QuantFile(dict[str, Any]):
    """A quantization config read from ``hf_quant_config.json`` beside config.json, not from config.json."""


def read_hf_quant_config(config_path: Path) -> QuantFile | None:
    """``hf_quant_config.json`` beside ``config_path``, which vLLM reads when config.json gives no
    ``quantization_config``; None where there is none. Its problems are a document's, as config.json's are
    (ConfigInvalid with their diagnostics; ConfigUnreadable where it cannot be read at all)."""
    from kvpolicy.json_text import DocumentInvalid, read_json_object

    path = config_path.parent / HF_QUANT_CONFIG
    if not path.is_file():
        return None
    try:
        document = read_json_object(path, what="quantization config")
    except OSError as exc:
        raise ConfigUnreadable(f"{path}: cannot read the quantization config vLLM reads with the model config: "
                               f"{exc.strerror}") from None
    except DocumentInvalid as exc:
        raise ConfigInvalid(exc) from None
    return QuantFile(document.data)


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization config as vLLM reads it."""

    data: Mapping[str, Any]
    method: str
    """``quant_method`` as vLLM normalises it ("" if none)."""
    key: tuple[str, ...]
    """Where vLLM reads it: ``("quantization_config",)`` (config.json's, or hf_quant_config.json's, which vLLM
    puts there), ``("text_config", "quantization_config")`` or ``("compression_config",)``."""
    for_cache: bool
    """Whether vLLM's cache config reads it: config.json's (or hf_quant_config.json's) top-level
    ``quantization_config``, not ``compression_config`` or a text config's."""

    @property
    def named(self) -> str:
        """The config as a message names it."""
        if isinstance(self.data, QuantFile):
            return f"the checkpoint's {HF_QUANT_CONFIG}"
        return f"the checkpoint's {'.'.join(self.key)}"

    def at(self, *keys: str) -> tuple[str, ...] | None:
        """The config.json path of a value in it (None: it is in hf_quant_config.json, not config.json)."""
        return _at(self.data, self.key, *keys)


def quantization(config: Mapping[str, Any], version: str = "0.33.0") -> Quantization | None:
    """The checkpoint's quantization config as vLLM ``version`` reads it (None: the checkpoint is not quantized),
    or the ModelSpecError of one vLLM cannot read."""
    found = _find(config)
    if found is None:
        return None
    data, key, for_cache = found
    where = ".".join(key) if not isinstance(data, QuantFile) else HF_QUANT_CONFIG
    if not isinstance(data, Mapping):
        raise ModelSpecError(f"{where} must be an object (vLLM cannot read {_shown(data)})", key, WRONG_TYPE)
    # A ModelOpt export named by its producer gets its method first (over whatever quant_method says).
    produced = _producer_method(data, key, where, version) if key[-1] == QUANTIZATION_KEY else None
    method = produced or data.get("quant_method", "")
    if not isinstance(method, str):
        raise ModelSpecError(f"{where}.quant_method must be a name (vLLM cannot read {_shown(method)})",
                             _at(data, key, "quant_method"), WRONG_TYPE)
    return Quantization(data, method.lower().replace("compressed_tensors", "compressed-tensors"), key, for_cache)


def _find(config: Mapping[str, Any]) -> tuple[Any, tuple[str, ...], bool] | None:
    """The quantization config vLLM reads, where, and whether its cache config does (vLLM's model reads the
    top-level config, else a multimodal model's text config, else ``compression_config``)."""
    top = config.get(QUANTIZATION_KEY)
    text = config.get("text_config")
    if top is not None and not _lifted_from_text(config):
        return top, (QUANTIZATION_KEY,), True
    if isinstance(text, Mapping) and text.get(QUANTIZATION_KEY) is not None:
        return text[QUANTIZATION_KEY], ("text_config", QUANTIZATION_KEY), False
    if config.get(COMPRESSION_KEY) is not None:
        return config[COMPRESSION_KEY], (COMPRESSION_KEY,), False
    return None


def _lifted_from_text(config: Mapping[str, Any]) -> bool:
    """Whether the top-level ``quantization_config`` is a multimodal text config's, lifted beside the wrapper's
    keys by ``load_config``."""
    text = config.get("text_config")
    return isinstance(text, Mapping) and text.get(QUANTIZATION_KEY) is config.get(QUANTIZATION_KEY)


def _at(data: Mapping[str, Any], key: tuple[str, ...], *keys: str) -> tuple[str, ...] | None:
    """The config.json path of the value at ``keys`` in the quantization config ``data`` read at ``key`` (None:
    ``data`` came from hf_quant_config.json)."""
    return None if isinstance(data, QuantFile) else (*key, *keys)


def _producer_method(data: Mapping[str, Any], key: tuple[str, ...], where: str, version: str) -> str | None:
    """The ``quant_method`` vLLM gives a ModelOpt export that names ModelOpt as its producer (or has a legacy
    ``modelopt_quant_config``), from its ``quant_algo``; None for any other config."""
    producer = data.get("producer", {})
    if not isinstance(producer, Mapping):
        raise ModelSpecError(f"{where}.producer must be an object (vLLM cannot read {_shown(producer)})",
                             _at(data, key, "producer"), WRONG_TYPE)
    inner = data.get("quantization", {})
    legacy = isinstance(inner, Mapping) and "modelopt_quant_config" in inner
    if producer.get("name") != "modelopt" and not legacy:
        return None
    if not isinstance(inner, Mapping):
        raise ModelSpecError(f"{where}.quantization must be an object (vLLM cannot read {_shown(inner)})",
                             _at(data, key, "quantization"), WRONG_TYPE)
    algo = inner.get("quant_algo")
    if algo is None:
        return None
    known = {a: m for a, m in MODELOPT_PRODUCER_METHODS.items()
             if not (a == "MIXED_PRECISION" and version.startswith("0.32."))}
    method = known.get(str(algo).upper())
    if method is None:
        raise ModelSpecError(
            f"{where}.quantization.quant_algo {_shown(algo)}: vLLM {version} knows no such ModelOpt algorithm "
            f"(\"Unknown ModelOpt quant algo\") and refuses the config as it loads it; known: {', '.join(known)}",
            _at(data, key, "quantization", "quant_algo"))
    return method
