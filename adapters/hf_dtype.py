"""The dtype a model's ``config.json`` gives its checkpoint, as transformers 5.19 reads it for vLLM 0.33 and
SGLang 0.5.23, and the values the plans refuse there.

transformers takes ``dtype`` and, where that is absent or null, the older ``torch_dtype`` (``dtype_key``); a
string is ``getattr(torch, name)``, so a name torch lacks stops the config's load and neither engine starts.
Other values get through by accident: the name of a torch attribute that is no dtype (``"Tensor"``), a number,
a boolean or an object, and a list or float wherever Python writes it with a dot (transformers' ``to_dict``
splits the text there; a module's name fails to copy). vLLM then serves the model in its preferred dtype
(bfloat16), SGLang keeps the value as its model dtype, which is no torch dtype. The plans read the names of
torch dtypes only (``TORCH_DTYPE_NAMES``, torch 2.13's) and refuse any other value at its key: stricter than
the engines where one started with it. tests/vllm/test_vllm_config_dtype.py and
tests/sglang/test_sglang_config_dtype.py hold the plans to each engine over random values. Pure data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE

if TYPE_CHECKING:
    from kvpolicy.document_codes import DocumentCode

DTYPE_KEYS = ("dtype", "torch_dtype")
"""The keys transformers reads a config's dtype from, in its order."""
TORCH_DTYPE_NAMES = frozenset({
    "bfloat16", "half", "float16", "float", "float32", "double", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "complex32", "chalf", "complex64", "cfloat", "complex128", "cdouble",
    "bool", "int8", "short", "int16", "int", "int32", "long", "int64",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
    "uint8", "uint16", "uint32", "uint64", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "bit", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
})
"""The names torch 2.13 gives its dtypes (aliases included): the strings a config's dtype may be."""
DTYPE_HINT = "write the checkpoint's dtype as torch names it: bfloat16, float16 or float32"


@dataclass(frozen=True)
class DtypeProblem:
    """Why the plans refuse a config's dtype: the key it is given by, the diagnostic's code and message."""

    key: str
    code: DocumentCode
    message: str
    hint: str = DTYPE_HINT

    @property
    def path(self) -> tuple[str]:
        return (self.key,)


def dtype_key(config: Mapping[str, Any]) -> str | None:
    """The key transformers takes the config's dtype from (``dtype`` first), None if neither gives one."""
    return next((key for key in DTYPE_KEYS if config.get(key) is not None), None)


def dtype_problem(config: Mapping[str, Any], shown: Callable[[Any], str] = repr) -> DtypeProblem | None:
    """What the plans refuse in the config's dtype (the module's docstring), None if it is a torch dtype's name
    or not given; ``shown`` writes the value in the message as the caller's other messages do."""
    key = dtype_key(config)
    if key is None:
        return None
    value = config[key]
    if not isinstance(value, str):
        return DtypeProblem(key, WRONG_TYPE, f"{key} {shown(value)}: a dtype is the name of a torch dtype, a string")
    if value not in TORCH_DTYPE_NAMES:
        return DtypeProblem(key, VALUE_NOT_ALLOWED, f"{key} {shown(value)} is not a torch dtype")
    return None
