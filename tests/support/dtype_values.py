"""Random dtypes of a model config, for holding the plans' reading of them to each engine's
(``kvpolicy.adapters.hf_dtype``): names of torch's dtypes, of its other attributes, other strings, and JSON
values of every other kind, under ``dtype``, ``torch_dtype`` or both. Imports torch."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from kvpolicy.adapters.hf_dtype import DTYPE_KEYS
from tests.support.json_values import JSON_VALUES

TORCH_NAMES = sorted(name for name in dir(torch) if not name.startswith("_"))
DTYPE_NAMES = [name for name in TORCH_NAMES if isinstance(getattr(torch, name), torch.dtype)]
"""The names torch gives its dtypes, aliases included."""
OTHER_TORCH_NAMES = [name for name in TORCH_NAMES if name not in DTYPE_NAMES]
"""torch's other attributes: classes (``Tensor``), functions (``add``), modules (``cuda``), constants."""

DTYPE_VALUES = st.one_of(
    st.sampled_from(DTYPE_NAMES), st.sampled_from(DTYPE_NAMES),  # half of them a dtype's name
    st.sampled_from(OTHER_TORCH_NAMES),
    st.sampled_from(["auto", "bf16", "Float16", "float32 ", "torch.float16", ""]),
    JSON_VALUES.filter(lambda value: value is not None),
    st.sampled_from([1e20, 1e-7, 0.5, [1.5], ["a.b"], {}, {"text_config": "bfloat16"}]),  # through to_dict or not
)
"""What a config may give as its dtype, valid or not (null: as if not given, drawn by ``dtype_entries``)."""


def is_torch_dtype(value: Any) -> bool:
    """Whether transformers' reading of a config's dtype (``config.dtype`` once loaded) is a torch dtype."""
    return isinstance(value, torch.dtype)


@st.composite
def dtype_entries(draw: st.DrawFn) -> dict[str, Any]:
    """A config's dtype keys: none, one of them, or both (the first null, or both given, another value each)."""
    keys = draw(st.sampled_from([(), *((key,) for key in DTYPE_KEYS), DTYPE_KEYS]))
    entries = {key: draw(DTYPE_VALUES) for key in keys}
    if len(keys) == 2 and draw(st.booleans()):
        entries[DTYPE_KEYS[0]] = None  # transformers then reads the second
    return entries
