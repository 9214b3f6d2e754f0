"""Hypothesis strategies for policy text.

``valid_policies()`` draws policies that lint without errors, written in varied
layouts (separators, blank lines, spacing, comments, units with and without a
space, `when` split over lines inside parentheses) so the formatter has work to do.
``mutated()`` breaks such a text the ways people and disks do.
"""

from __future__ import annotations

import re
from functools import cache

from hypothesis import strategies as st

from kvpolicy.engines import ENGINES

# ---- layout ---------------------------------------------------------------------

SPACE = st.sampled_from([" ", " ", " ", "  ", "\t", " \t "])
COMMENT_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
    max_size=20,
).map(lambda s: ("# " + s).rstrip())
NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-._:"


@st.composite
def _line_end(draw) -> str:
    """What ends a statement: a newline (maybe with a comment, maybe blank lines) or ';'."""
    kind = draw(st.sampled_from(["nl", "nl", "nl", "semi", "comment", "blank"]))
    if kind == "semi":
        return draw(st.sampled_from([";", " ;", "; ", ";\n"]))
    if kind == "comment":
        return draw(SPACE) + draw(COMMENT_TEXT) + "\n"
    if kind == "blank":
        return "\n" * draw(st.integers(2, 4))
    return "\n"


LINE_END = _line_end()

# Strategies are built once and reused: building them inside every draw costs
# more than the drawing (Hypothesis validates each new strategy).


@cache
def size(low_gib: float = 0, high_gib: float = 64) -> st.SearchStrategy[str]:
    @st.composite
    def draw_size(draw) -> str:
        unit = draw(st.sampled_from(["MiB", "GiB", "GiB", "GiB"]))
        scale = 1024 if unit == "MiB" else 1
        number = draw(st.integers(int(low_gib * scale), int(high_gib * scale)))
        text = str(number)
        if number and unit == "GiB" and draw(st.booleans()):
            decimal = f"{number}.{draw(st.sampled_from(['0', '5', '25']))}"
            text = decimal if float(decimal) <= high_gib else text
        return f"{text}{draw(st.sampled_from(['', ' ', ' ', '  ']))}{unit}"

    return draw_size()


@cache
def percent(low: int = 0, high: int = 100) -> st.SearchStrategy[str]:
    return st.tuples(st.integers(low, high), st.sampled_from(["", "", " "])).map(lambda t: f"{t[0]}{t[1]}%")


DURATION = st.tuples(st.integers(0, 600), st.sampled_from(["", "", " "]), st.sampled_from(["ms", "s", "s", "m", "h"])).map(
    lambda t: "".join(map(str, t))
)
CHUNK = st.sampled_from([2, 4, 8, 64, 2048]).map(lambda mib: f"{mib} MiB")
SHUFFLE = st.randoms(use_true_random=False)


def quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---- expressions ------------------------------------------------------------------

SIZE_ATTRIBUTES = st.sampled_from(
    ["gpu.free", "gpu.used", "gpu.capacity", "gpu.reserved", "model.used", "model.target", "model.min", "model.max"]
)
OPERATORS = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])


@st.composite
def _comparison(draw) -> str:
    op = draw(OPERATORS)
    kind = draw(st.sampled_from(["size", "size", "percent", "duration", "int", "string", "attr"]))
    if kind == "size":
        return f"{draw(SIZE_ATTRIBUTES)} {op} {draw(size())}"
    if kind == "percent":
        return f"{draw(st.sampled_from(['gpu.free', 'model.used']))} {op} {draw(percent())}"
    if kind == "duration":
        return f"model.idle {op} {draw(DURATION)}" if draw(st.booleans()) else f"{draw(DURATION)} {op} model.idle"
    if kind == "int":
        return f"{draw(st.sampled_from(['model.priority', 'model.weight']))} {op} {draw(st.integers(0, 1000))}"
    if kind == "string":
        attr = draw(st.sampled_from(["model.engine", "model.name"]))
        value = draw(st.sampled_from(["vllm", "sglang", '"qwen3-8b"', '"a b"']))
        return f"{attr} {draw(st.sampled_from(['==', '!=']))} {value}"
    return f"gpu.free {op} gpu.used"


COMPARISON = _comparison()
PAREN_GAP = st.sampled_from([" ", "", "\n    ", "  # why\n    "])  # newlines are free inside parentheses


def expression(draw, depth: int = 0) -> str:
    """A condition: comparisons joined by and/or, negated, parenthesized (over several lines)."""
    if depth < 2 and draw(st.integers(0, 2)) == 0:
        op = draw(st.sampled_from(["and", "or"]))
        return f"{expression(draw, depth + 1)} {op} {expression(draw, depth + 1)}"
    if depth < 3 and draw(st.integers(0, 4)) == 0:
        inner = expression(draw, depth + 1)
        if draw(st.booleans()):
            simple = not re.search(r"\b(and|or)\b", inner) or inner.startswith("(")
            return f"not {inner}" if simple else f"not ({inner})"
        return f"({inner}{draw(PAREN_GAP)})"
    return draw(COMPARISON)


# ---- statements -----------------------------------------------------------------


def statement(draw, indent: str, tokens: list[str]) -> str:
    return indent + draw(SPACE).join(tokens) + draw(LINE_END)


def block(draw, indent: str, header: list[str], items: list[list[str]]) -> str:
    """``header { items }`` on several lines, or on one line with ';'."""
    draw(SHUFFLE).shuffle(items)
    if draw(st.integers(0, 3)) == 0:  # one line
        body = "; ".join(draw(SPACE).join(item) for item in items)
        return indent + " ".join(header) + " {" + (f" {body} " if body else "") + "}" + draw(LINE_END)
    inner = indent + draw(st.sampled_from(["  ", "    ", "\t", ""]))
    opening = draw(st.sampled_from([" {", "{", "  {"])) + draw(st.sampled_from(["\n", "  # open\n", "\n\n"]))
    body = "".join(statement(draw, inner, item) for item in items)
    return indent + " ".join(header) + opening + body + indent + "}" + draw(LINE_END)


DEFAULT_POOLS = ("swa", "c4", "c128", "indexer", "compressor_state")


@cache
def _pools(engine: str | None) -> st.SearchStrategy[list[str]]:
    vocabulary = sorted(ENGINES[engine].pools) if engine in ENGINES else list(DEFAULT_POOLS)
    return st.lists(st.sampled_from(vocabulary), unique=True, max_size=3)


def model_block(draw, name: str) -> str:
    engine = draw(st.sampled_from([None, "sglang", "vllm", "any"]))
    items: list[list[str]] = []
    if engine:
        items.append(["engine", engine])
    if draw(st.booleans()):
        items.append(["priority", str(draw(st.integers(0, 1000)))])
    # SGLang and vLLM blocks need a reserve to be valid (KV028, KV029: their adapters refuse
    # to start without one; vLLM's elastic pools are not drawn here).
    if engine in ("sglang", "vllm") or draw(st.booleans()):
        items.append(["reserve", draw(size(0, 40))])
    if draw(st.booleans()):
        items.append(["min", draw(size(0, 1))])  # at most 1 GiB: below any max drawn here
    if draw(st.booleans()):
        items.append(["max", draw(st.one_of(size(1, 100), percent(1, 100)))])
    if draw(st.booleans()):
        items.append(["weight", str(draw(st.integers(1, 10000)))])
    for pool in draw(_pools(engine)):
        fields = [["owner", "runtime"]] if draw(st.booleans()) else []
        if draw(st.booleans()):
            fields.append(["max", draw(st.one_of(size(0, 20), percent(0, 100)))])
        body = "; ".join(" ".join(f) for f in fields)
        items.append(["pool", pool, "{" + (f" {body} " if body else "") + "}"])
    return block(draw, "", ["model", quoted(name)], items)


ORDER_KEYS = st.lists(st.sampled_from(["priority", "idle", "used", "weight", "target", "min", "max"]), min_size=1, max_size=3, unique=True)
SHRINK_TO = st.one_of(st.sampled_from(["min", "target"]), size(0, 8), percent(0, 50))


def rule_block(draw, name: str) -> str:
    items: list[list[str]] = [["when", expression(draw)], ["shrink", "to", draw(SHRINK_TO)]]
    if draw(st.booleans()):
        keys = draw(ORDER_KEYS)
        items.append(["order", ", ".join(f"{k} {draw(st.sampled_from(['asc', 'desc']))}" if draw(st.booleans()) else k for k in keys)])
    items.append(["grace", draw(DURATION)])
    if draw(st.booleans()):
        items.append(["cooldown", draw(DURATION)])
    return block(draw, "", ["rule", quoted(name)], items)


HEADROOM = st.one_of(size(0, 8), percent(0, 10))
KINDS = st.lists(st.sampled_from(["defaults", "gpu", "model", "model", "rule"]), max_size=8)
MODEL_NAME = st.text(alphabet=NAME_CHARS, min_size=1, max_size=10)


@st.composite
def _valid_policies(draw) -> str:
    parts: list[str] = []
    if draw(st.booleans()):
        parts.append(draw(COMMENT_TEXT) + "\n" + draw(st.sampled_from(["", "\n"])))
    parts.append(statement(draw, "", ["version", "1"]))
    kinds = draw(KINDS)
    gpu_ids = iter(range(1000))
    used_star = used_defaults = False
    names: set[str] = set()
    for index, kind in enumerate(kinds):
        if kind == "defaults" and not used_defaults:
            used_defaults = True
            items = []
            if draw(st.booleans()):
                items.append(["headroom", draw(HEADROOM)])
            if draw(st.booleans()):
                items.append(["chunk", draw(CHUNK)])
            parts.append(block(draw, "", ["defaults"], items))
        elif kind == "gpu":
            if not used_star and draw(st.booleans()):
                used_star = True
                header = ["gpu", "*"]
            else:
                header = ["gpu", ", ".join(quoted(f"cuda:{next(gpu_ids)}") for _ in range(draw(st.integers(1, 3))))]
            items = []
            if draw(st.booleans()):
                items.append(["headroom", draw(HEADROOM)])
            if draw(st.booleans()):
                items.append(["capacity", draw(size(100, 200))])  # so 1% is above any min drawn
            if draw(st.booleans()):
                items.append(["chunk", draw(CHUNK)])
            parts.append(block(draw, "", header, items))
        elif kind == "model":
            name = draw(MODEL_NAME) + draw(st.sampled_from(["", "", "", "*"]))
            if name not in names:
                names.add(name)
                parts.append(model_block(draw, name))
        elif kind == "rule":
            parts.append(rule_block(draw, f"rule-{index}"))
    if draw(st.booleans()):
        parts.append(draw(COMMENT_TEXT) + draw(st.sampled_from(["", "\n"])))
    return "".join(parts)


def valid_policies() -> st.SearchStrategy[str]:
    """Policies that lint with no error (warnings are allowed)."""
    return VALID_POLICIES


VALID_POLICIES = _valid_policies()


# ---- mutations ------------------------------------------------------------------

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|\d+(?:\.\d+)?|[A-Za-z_][\w.]*|\s+|.', re.S)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


@st.composite
def mutated(draw, base: st.SearchStrategy[str]) -> bytes:
    """``base`` broken by one to three mutations; bytes, since some are not UTF-8."""
    text = draw(base)
    for _ in range(draw(st.integers(1, 3))):
        parts = tokens(text)
        if not parts:
            parts = [""]
        i = draw(st.integers(0, len(parts) - 1))
        how = draw(st.sampled_from([
            "delete", "delete", "duplicate", "swap", "truncate", "replace", "insert",
            "nest", "huge", "brace", "unicode",
        ]))
        if how == "delete":
            del parts[i]
        elif how == "duplicate":
            parts.insert(i, parts[i])
        elif how == "swap" and i + 1 < len(parts):
            parts[i], parts[i + 1] = parts[i + 1], parts[i]
        elif how == "truncate":
            cut = draw(st.integers(0, len(text)))
            parts = [text[:cut]]
        elif how == "replace":
            parts[i] = draw(st.sampled_from(["{", "}", "(", ")", ";", ",", "*", '"', "#", "\n", "<", "==", "-", ".", "0", "1e9", "GiB", "%", "model", "rule", "when", "to", "and", "not", "version", "pool", "max", "gpu.free", "\\"]))
        elif how == "insert":
            parts.insert(i, draw(st.text(max_size=5)))
        elif how == "nest":
            depth = draw(st.integers(10, 200))
            opener = draw(st.sampled_from(["(", "{", "not ", "pool x {", "model \"m\" {"]))
            closer = {"(": ")", "{": "}", "not ": "", "pool x {": "}", "model \"m\" {": "}"}[opener]
            parts.insert(i, opener * depth + draw(st.sampled_from(["", "gpu.free < 1 GiB"])) + closer * draw(st.integers(0, depth)))
        elif how == "huge":
            parts.insert(i, draw(st.sampled_from(["9" * 40, "1" + "0" * 400, "0." + "0" * 50 + "1", "-" + "9" * 25])) + draw(st.sampled_from(["", " GiB", "%", "s", " TiB"])))
        elif how == "brace":
            parts.insert(i, draw(st.sampled_from(["{", "}", "}}", "{{", "(", ")"])))
        elif how == "unicode":
            parts.insert(i, draw(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=3)))
        text = "".join(parts)
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 15)) == 0:  # not UTF-8
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe9", b"\x80\x80", b"\xed\xa0\x80"])) + data[at:]
    return data
