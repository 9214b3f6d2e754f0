"""vLLM refuses a config.json whose value its transformers config class refuses.

vLLM loads a model's config with transformers' class for its model type (``class_defaults.CONFIG_CLASSES``),
which checks each declared field's kind (and Llama's ``initializer_range``, its range) as the config loads
(``kvpolicy.adapters.hf_config_kinds``), so vLLM does not start: a ``"rms_norm_eps": 1`` where a float goes, a
null ``hidden_act``. The plan reads only some fields, and those with checks of its own; this refuses the rest
as the class would. vLLM 0.32 loads DeepSeek-V4 with a class of its own, which checks nothing
(``deepseek_v4_032`` holds what 0.32 fails with instead). Pure code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE
from kvpolicy.validation import shown

from ...hf_config_kinds import FIELD_KINDS, SUB_CONFIGS, declared_at, out_of_range, refused
from .class_defaults import WRAPPER_CLASSES, WRAPPER_SUB_CONFIGS, class_default, config_class
from .config_values import ModelSpecError


def check_field_kinds(config: Mapping[str, Any], engine_version: str, part: str | None = None) -> None:
    """Refuse the first field of a config whose value its config class does not take (ModelSpecError at the
    value: WRONG_TYPE for its kind, VALUE_NOT_ALLOWED outside a validator's range); a field the class filled, a
    model type the plan knows no class of, or DeepSeek-V4 for vLLM 0.32, passes. A multimodal wrapper's text
    config is checked against its class, the wrapper's own fields against the wrapper's, and its vision config
    against that config's class (Gemma-3's; a field written both in the wrapper and in its text config is the
    text config's). ``part``: only the fields of one of those configs ("wrapper", "text_config",
    "vision_config"), as transformers checks them one config at a time.

    First is transformers' first, whatever the file's order: the wrapper's own fields, then its text config's,
    then its vision config's (the order it builds them in), and within one config the order its class declares
    them in (``FIELD_KINDS``)."""
    cls = config_class(config)
    if cls is None or (config.get("model_type") == "deepseek_v4" and engine_version.startswith("0.32.")):
        return
    fields = [field for field in _fields(config, cls.name) if part is None or _part(field, cls.name) == part]
    for holder, key, class_name, path in sorted(fields, key=partial(_checked_at, text_class=cls.name)):
        if class_default(holder, key) is None:
            _check(holder, key, class_name, path)


_PARTS = ("wrapper", *WRAPPER_SUB_CONFIGS)
"""The configs of a multimodal wrapper in the order transformers checks them."""


Field = tuple[Mapping[str, Any], str, str, tuple[str, ...]]
"""The object that holds a field, its key, the class that checks it, and its path as the plan reads it."""


def _part(field: Field, text_class: str) -> str:
    """Which config a field of ``_fields`` belongs to: the text config (the model's own, for a config of one
    class), a config object the wrapper holds (its key), or the wrapper."""
    _, _, class_name, path = field
    if class_name == text_class:
        return "text_config"
    return path[0] if len(path) > 1 else "wrapper"


def _checked_at(field: Field, text_class: str) -> tuple[int, int]:
    """Where transformers checks ``field``: its config's place in ``_PARTS``, then the field's in its class's
    declarations (a field the class does not declare, which nothing checks, last)."""
    _, key, class_name, _ = field
    return _PARTS.index(_part(field, text_class)), declared_at(FIELD_KINDS[class_name], key)


def _fields(config: Mapping[str, Any], text_class: str) -> Iterator[Field]:
    """Each field of ``config``: a wrapper's own fields (and those of a config object it holds) with the
    wrapper's classes, its text config's (at text_config's place) with ``text_class``. In a config without a
    text config, a field only the wrapper's class declares is the wrapper's."""
    document = getattr(config, "document", None)
    model_type = (document.data if document is not None else config).get("model_type")
    wrapper = WRAPPER_CLASSES.get(model_type) if isinstance(model_type, str) else None
    text = config.get("text_config") if getattr(config, "home", ()) else None
    if not isinstance(text, Mapping):
        own = FIELD_KINDS[wrapper].keys() - FIELD_KINDS[text_class].keys() if wrapper else set()
        for key in config:
            if wrapper and key in own:
                yield from _wrapper_field(config, key, wrapper)
            else:
                yield config, key, text_class, (key,)
        return
    origins: Mapping[str, Any] = getattr(config, "origins", {})
    for key in config:
        if key == "text_config":
            yield from ((text, inner, text_class, (inner,)) for inner in text)
        elif wrapper and origins.get(key) == (key,):  # the wrapper's own, not a key lifted from its text config
            yield from _wrapper_field(config, key, wrapper)


def _wrapper_field(config: Mapping[str, Any], key: str, wrapper: str) -> Iterator[Field]:
    """A wrapper's own field, then, where it holds a config object of another class, that object's fields."""
    yield config, key, wrapper, (key,)
    sub, value = SUB_CONFIGS.get(wrapper, {}).get(key), config[key]
    if sub is not None and isinstance(value, Mapping):
        yield from ((value, inner, sub, (key, inner)) for inner in value)


def _check(fields: Mapping[str, Any], key: str, class_name: str, path: tuple[str, ...]) -> None:
    """Refuse ``fields[key]`` (at ``path``) where ``class_name``'s type check or validator refuses it."""
    table = FIELD_KINDS[class_name]
    if key not in table:
        return
    as_written: Mapping[str, Any] = getattr(fields, "as_written", {})
    value = as_written.get(key, fields[key])  # what the class's type check sees, before it recomputes
    wanted = refused(table, key, value)
    bounds = out_of_range(class_name, key, value) if wanted is None else None
    if wanted is None and bounds is None:
        return
    takes, code = (wanted, WRONG_TYPE) if wanted is not None else (f"a value {bounds}", VALUE_NOT_ALLOWED)
    raise ModelSpecError(
        f"{'.'.join(path)} {shown(value, 200)}: {class_name} takes {takes} only, so transformers refuses the config "
        "and vLLM cannot load it", path, code, "write the value as the model's own config.json does",
    )
