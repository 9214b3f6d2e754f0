"""The order in which SGLang 0.5.23 meets a DeepSeek-V4 config's faults, so the plan names first the one SGLang
stops at (``geometry.read_geometry`` raises its refusals in this order).

transformers' ``DeepseekV4Config`` checks the kinds of the fields it declares, reads the dtype and the keys every
config class reads for itself, checks a ``rope_scaling`` as the ``rope_parameters`` it becomes (``MOVED_TO``),
then builds what the pools need of the fields (``class_stage``); the RoPE parameters are converted, SGLang's alias
class checks its own fields' kinds, and SGLang's own reading of the built config comes last (``READING_ORDER``).
Each rule was measured against SGLang's resolution of configs with two faults
(tests/sglang/test_sglang_refusal_order.py). Pure rules over the geometry's problems: no sglang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config_fields import CONTEXT_LENGTH_KEYS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kvpolicy.validation import Problem

MOVED_TO = {"rope_scaling": "rope_parameters"}
"""A key transformers moves to a field of another name, whose kind it checks once it has read the dtype and
the base keys."""
LATER = 3
"""``class_stage`` of what DeepseekV4Config does not check as it builds."""
ROPE_KEYS = {("rope_scaling",), ("rope_parameters",)}
"""Where the RoPE parameters are written (the key of a context problem that is theirs)."""


def class_stage(data: Mapping[str, Any], problem: Problem) -> int:
    """Where DeepseekV4Config meets a problem the geometry finds: 0 as it maps the compress ratios to layer types
    (a ratio it has no type for, no list), 1 as it divides by ``qk_rope_head_dim`` (no number), 2 as its
    layer-type validator compares their count with the layers (a negative layer count too), ``LATER`` not at
    all (SGLang's own reading meets it, later)."""
    if problem.kind == "missing-field":
        return LATER
    if problem.path[:1] == ("compress_ratios",):
        return 0 if len(problem.path) > 1 or problem.kind == "wrong-type" else 2
    if problem.path[:1] == ("qk_rope_head_dim",) and not is_number(data.get("qk_rope_head_dim")):
        return 1
    layers = data.get("num_hidden_layers")
    if problem.path[:1] == ("num_hidden_layers",) and isinstance(layers, int) and layers < 0:
        return 2
    return LATER


def is_number(value: object) -> bool:
    """A value Python divides and compares as a number: a JSON number, ``true`` (1) or ``false`` (0)."""
    return isinstance(value, (int, float))


READING_ORDER = ("qk_rope_head_dim no number", "architectures", *CONTEXT_LENGTH_KEYS[:-1], "sliding_window given",
                 "index_head_dim given", "compress_ratios given", "hc_mult", "max_position_embeddings",
                 "num_hidden_layers", "head_dim", "qk_rope_head_dim", "index_head_dim")
"""The order in which SGLang's own reading of the built config meets the geometry's problems (measured against
its resolution: a ``qk_rope_head_dim`` it cannot divide, the architecture, the context length keys, the fields
it requires, the ``hc_mult`` it compares, the context length, the layers it divides by, the V4 layout, the
indexer's tensor); any other problem (a value it starts with, which the plan refuses) after them."""


def reading_rank(data: Mapping[str, Any], problem: Problem) -> int:
    """``problem``'s place in ``READING_ORDER``."""
    key = problem.path[0] if problem.path else ""
    if key == "qk_rope_head_dim" and not is_number(data.get(key)):
        key = "qk_rope_head_dim no number"
    return READING_ORDER.index(key) if key in READING_ORDER else len(READING_ORDER)


def missing_rank(key: str) -> int:
    """A required field's place in ``READING_ORDER`` where the config leaves it out."""
    return READING_ORDER.index(key if key == "architectures" else f"{key} given")
