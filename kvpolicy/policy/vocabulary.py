"""The words of the language: keywords per block, attributes with their kinds, units."""

from __future__ import annotations

TOP_LEVEL = ("version", "defaults", "gpu", "model", "rule")
RECOVERED = "_kvpolicy_recovered_"
"""The placeholder statement that recovery puts in place of a line with a syntax error
(``kvpolicy.policy.syntax``): the builder and the error messages pass over it."""
DEFAULTS_FIELDS = ("headroom", "chunk")
GPU_FIELDS = ("headroom", "capacity", "chunk")
MODEL_FIELDS = ("engine", "priority", "reserve", "min", "max", "weight", "pool")
POOL_FIELDS = ("owner", "max")
RULE_FIELDS = ("when", "order", "shrink", "grace", "cooldown")

OWNERS = ("runtime", "elastic")
DIRECTIONS = ("asc", "desc")
DIRECTION_ALIASES = {"ascending": "asc", "descending": "desc", "up": "asc", "down": "desc"}
"""Spellings of a direction that did-you-mean alone would not catch."""
SHRINK_TARGETS = ("min", "target")

# Attribute → kind: what a comparison may put on the other side.
GPU_ATTRIBUTES = {
    "gpu.capacity": "size",
    "gpu.free": "size",
    "gpu.used": "size",
    "gpu.reserved": "size",
}
MODEL_ATTRIBUTES = {
    "model.used": "size",
    "model.waiting": "size",
    "model.idle": "duration",
    "model.priority": "int",
    "model.weight": "int",
    "model.min": "size",
    "model.max": "size",
    "model.target": "size",
    "model.engine": "string",
    "model.name": "string",
}
ATTRIBUTES = {**GPU_ATTRIBUTES, **MODEL_ATTRIBUTES}
ORDER_KEYS = {name.split(".", 1)[1]: kind for name, kind in MODEL_ATTRIBUTES.items()}

# Units people write that kvpolicy spells differently.
EXPONENT_HINT = "write the number out (`1000 MiB`), or use a larger unit (`1 GiB`)"
"""For ``1e3``: the language's numbers have no exponent."""

UNIT_ALIASES = {
    "msec": "ms", "msecs": "ms", "millisecond": "ms", "milliseconds": "ms",
    "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "byte": "B", "bytes": "B", "percent": "%", "pct": "%",
}
