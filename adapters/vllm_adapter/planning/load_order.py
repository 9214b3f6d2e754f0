"""The order in which transformers meets a config's faults as vLLM loads it, for a config whose dtype it cannot
read: which refusal vLLM stops at first.

Each strict config class checks the kinds of the fields it declares, then reads its dtype. A multimodal wrapper
(Gemma-3's) checks its own fields, then builds its text config (kinds, dtype) and its vision config (kinds,
dtype), and reads its own dtype last. Where no dtype is refused, the plan keeps its own order (``make_plan``: the
kinds after its checks of the fields it reads, whose messages say more). Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

from .config_values import ModelSpecError
from .class_defaults import WRAPPER_SUB_CONFIGS
from .field_kinds import check_field_kinds
from .hf_config import check_config_dtypes, dtype_refusal, gives_own_dtype, is_wrapper


def check_dtypes_in_load_order(config: Mapping[str, Any], engine_version: str) -> None:
    """``check_config_dtypes``, but where a dtype is refused, the refusal transformers meets first (a field of a
    kind its class does not take, or another config's dtype)."""
    try:
        check_config_dtypes(config)
    except ModelSpecError:
        for check in _load_order(config, engine_version):
            check()
        raise


def _load_order(config: Mapping[str, Any], engine_version: str) -> Iterator[Callable[[], None]]:
    """The checks of what transformers refuses as it loads ``config``, in its order; each raises ModelSpecError."""
    if not is_wrapper(config):
        yield partial(check_field_kinds, config, engine_version)
        yield partial(_raise_dtype, config, "model")
        return
    own = gives_own_dtype(config)
    yield partial(check_field_kinds, config, engine_version, "wrapper")
    for sub in WRAPPER_SUB_CONFIGS:
        yield partial(check_field_kinds, config, engine_version, sub)
        # without a dtype of the wrapper's own, the text config's is the one vLLM reads: refused as the model's
        yield partial(_raise_dtype, config, "model" if sub == "text_config" and not own else sub)
    if own:
        yield partial(_raise_dtype, config, "model")


def _raise_dtype(config: Mapping[str, Any], level: str) -> None:
    refusal = dtype_refusal(config, level)
    if refusal is not None:
        raise refusal
