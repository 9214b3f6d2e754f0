"""The order in which transformers meets a config's faults as vLLM loads it, for a config it cannot build (a
dtype it cannot read, a fault of the keys every config class reads for itself or of the RoPE parameters): which
refusal vLLM stops at.

Each strict config class checks the kinds of the fields it declares, then reads its dtype, then its base keys
(``base_keys``). A multimodal wrapper (Gemma-3's) checks its own fields, then builds its text config (kinds,
dtype, base keys) and its vision config (the same), and reads its own dtype and base keys last. Where nothing of
this is refused, the plan checks what vLLM reads of the loaded config, then the kinds of every field
(``make_plan``); where one of its checks refuses, the first field of a refused kind is named instead, as
transformers stops there first, but a refusal of that same field keeps the plan's message, which says more
(``kinds_first``). Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any

from .base_keys import base_refusal, check_config_base
from .class_defaults import WRAPPER_SUB_CONFIGS, is_wrapper
from .config_values import ModelSpecError
from .field_kinds import check_field_kinds
from .hf_config import check_config_dtypes, dtype_refusal, gives_own_dtype
from .max_len import check_rope_parameters


def check_config_load(config: Mapping[str, Any], engine_version: str) -> None:
    """``check_config_dtypes``, ``check_config_base`` and the RoPE parameters (``check_rope_parameters``), but
    where one refuses, the refusal transformers meets first (a field of a kind its class does not take, a
    config's dtype or base keys; the RoPE parameters it converts after them, and vLLM checks them later)."""
    try:
        check_config_dtypes(config)
        check_config_base(config)
        check_rope_parameters(config)
    except ModelSpecError:
        for check in _load_order(config, engine_version):
            check()
        raise


@contextmanager
def kinds_first(config: Mapping[str, Any], engine_version: str) -> Iterator[None]:
    """Run the plan's checks of what vLLM reads once the config is loaded; where one refuses, name instead the
    first field of a kind its config class refuses (``check_field_kinds``): transformers stops there as the
    config loads. A refusal of that same field (or of a value in it) keeps the plan's own message, which says
    more."""
    try:
        yield
    except ModelSpecError as own:
        try:
            check_field_kinds(config, engine_version)
        except ModelSpecError as first:
            if first.key is not None and (own.key is None or own.key[:len(first.key)] != first.key):
                raise first from None
        raise


def _load_order(config: Mapping[str, Any], engine_version: str) -> Iterator[Callable[[], None]]:
    """The checks of what transformers refuses as it loads ``config``, in its order; each raises ModelSpecError."""
    if not is_wrapper(config):
        yield partial(check_field_kinds, config, engine_version)
        yield partial(_raise, dtype_refusal, config, "model")
        yield partial(_raise, base_refusal, config, "model")
        return
    own = gives_own_dtype(config)
    yield partial(check_field_kinds, config, engine_version, "wrapper")
    for sub in WRAPPER_SUB_CONFIGS:
        yield partial(check_field_kinds, config, engine_version, sub)
        # without a dtype of the wrapper's own, the text config's is the one vLLM reads: refused as the model's
        yield partial(_raise, dtype_refusal, config, "model" if sub == "text_config" and not own else sub)
        yield partial(_raise, base_refusal, config, sub)
    if own:
        yield partial(_raise, dtype_refusal, config, "model")
    yield partial(_raise, base_refusal, config, "model")


def _raise(refusal: Callable[[Mapping[str, Any], str], ModelSpecError | None], config: Mapping[str, Any],
           level: str) -> None:
    found = refusal(config, level)
    if found is not None:
        raise found
