"""Hover: what the word under the cursor means.

A keyword or attribute: its line in the language reference. A size or percentage:
its value in bytes and GiB (against the GPUs' capacities, when known). A lint code
in a comment: the rule's doc. A model pattern: which instances of the facts it
binds, by the evaluator's own resolution (most specific pattern wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from kvpolicy.engines import ANY_ENGINE, ENGINES, elastic_pools, pool_vocabulary
from kvpolicy.lsp import reference
from kvpolicy.lsp.documents import PolicyDocument
from kvpolicy.lsp.language import ModelBlock, Policy, binding_block, gpu_capacity, matches, rule_doc, vocabulary as v
from kvpolicy.lsp.positions import Pos, Region
from kvpolicy.lsp.scan import BLOCK_FIELDS, Block, Outline, Token
from kvpolicy.units import DURATION_UNITS, GiB, SIZE_UNITS, format_bytes, percent_of, size_bytes

_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))[ \t]*(%|[A-Za-z_][A-Za-z0-9_]*)?")
_CODE = re.compile(r"KV\d{3}")
_CONDITION_WORDS = ("and", "or", "not")


@dataclass(frozen=True)
class HoverText:
    markdown: str
    region: Region


def hover(doc: PolicyDocument, pos: Pos) -> HoverText | None:
    outline = doc.outline
    offset = outline.offset(pos.line, pos.col)
    token = outline.token_at(offset)
    if token is None:
        return None
    region = Region.on_line(token.line, token.col, token.end_col)
    text: str | None = None
    if token.kind == "COMMENT":
        return _code_in_comment(token, pos)
    if token.kind == "QUANTITY":
        text = _quantity(doc, outline, token)
    elif token.kind == "ATTRIBUTE":
        text = _reference(token.text)
    elif token.kind == "NAME":
        text = _word(outline, token)
    elif token.kind == "STRING":
        text = _model_pattern(doc, outline, token)
    return HoverText(text, region) if text else None


# ---- words ------------------------------------------------------------------------------


def _reference(word: str, block_kind: str | None = None) -> str | None:
    """The reference's line for ``word``; of several, the one whose table is about ``block_kind``."""
    found = reference.entries_for(word)
    if not found:
        return None
    if block_kind is not None and len(found) > 1:
        fields = set(BLOCK_FIELDS.get(block_kind, ()))
        found = [max(found, key=lambda e: len(fields & set(e.siblings)))]
    return "\n\n---\n\n".join(e.markdown() for e in found)


def _word(outline: Outline, token: Token) -> str | None:
    statement = token.statement
    if statement is None:
        return None
    block = statement.block
    words = [t.text for t in statement.tokens]
    index = statement.tokens.index(token)
    keyword = statement.keyword
    if index == 0 and token.text in BLOCK_FIELDS.get(block.kind, ()):
        return _reference(token.text, block.kind)
    if keyword == "shrink" and index == 1 and token.text == "to":
        return _reference("to")
    if keyword == "when" and token.text in _CONDITION_WORDS:
        return _reference(token.text)
    if keyword == "order" and index > 0:
        if token.text in v.ORDER_KEYS:
            return _reference(f"model.{token.text}")
        if token.text in v.DIRECTIONS:
            return _reference("order", "rule")
    if keyword == "shrink" and words[1:2] == ["to"] and token.text in v.SHRINK_TARGETS:
        return _reference("to")
    if keyword == "engine" and index == 1:
        return _engine(token.text)
    if keyword == "owner" and index == 1:
        return _reference("owner", "pool")
    if keyword == "pool" and index == 1 and block.kind == "model":
        return _pool(block, token.text)
    return None


def _engine(name: str) -> str | None:
    if name == ANY_ENGINE:
        return "**engine any**: the block binds instances of every engine (the default)."
    engine = ENGINES.get(name)
    if engine is None:
        return None
    elastic = ", ".join(f"`{p}`" for p in sorted(engine.elastic_pools)) or "none"
    return (
        f"**engine {name}**\n\npools: {', '.join(f'`{p}`' for p in sorted(engine.pools))}\n\n"
        f"may be `owner elastic`: {elastic}"
    )


def _model_engine(model: Block) -> str | None:
    statement = model.setting("engine")
    if statement is None or len(statement.tokens) < 2:
        return None
    return statement.tokens[1].text


def _pool(model: Block, name: str) -> str | None:
    engine = _model_engine(model)
    known = pool_vocabulary(engine)
    who = f"engine {engine}" if engine else "any engine"
    if name not in known:
        return None
    elastic = name in elastic_pools(engine)
    return (
        f"**pool {name}** of {who}: "
        + ("may be `owner elastic` (kvpolicy's allocator backs it) or `owner runtime`" if elastic
           else "`owner runtime` only (the engine allocates it; kvpolicy counts it)")
    )


def _code_in_comment(token: Token, pos: Pos) -> HoverText | None:
    for match in _CODE.finditer(token.text):
        start, end = token.col + match.start(), token.col + match.end()
        if start <= pos.col <= end:
            doc = rule_doc(match.group())
            if doc is None:
                return None
            parts = [
                f"**{doc.code} {doc.name}** · {doc.severity} · "
                + ("suppressible" if doc.suppressible else "not suppressible"),
                doc.summary,
            ]
            for heading, body in doc.sections.items():
                parts.append(f"**{heading}**\n\n{body}")
            parts.append(f"[docs/lint-rules.md]({doc.href})")
            return HoverText("\n\n".join(parts), Region.on_line(token.line, start, end))
    return None


# ---- values -------------------------------------------------------------------------------


def _capacities(doc: PolicyDocument, block: Block) -> list[tuple[str, int]]:
    """(which GPUs, capacity) to resolve a percentage in ``block`` against."""
    policy = doc.model
    ids = _gpu_ids(block) if block.kind == "gpu" else None
    found: list[tuple[str, int]] = []
    facts = doc.context.facts
    if facts is not None:
        for gpu in facts.gpus:
            if ids is None or gpu.id in ids:
                declared = gpu_capacity(policy, gpu.id) if policy is not None else None
                found.append((gpu.id, declared or gpu.capacity))
    elif policy is not None and ids:
        found += [(gpu_id, c) for gpu_id in ids if (c := gpu_capacity(policy, gpu_id) or doc.context.gpu_capacity)]
    elif doc.context.gpu_capacity is not None:
        found.append((f"every GPU ({doc.context.capacity_from or 'kvpolicy.gpuCapacity'})", doc.context.gpu_capacity))
    elif policy is not None:
        for gpu_block in policy.gpus:
            if gpu_block.capacity is not None:
                label = ", ".join(s.value for s in gpu_block.ids) or "*"
                found.append((label, gpu_block.capacity.bytes))
    grouped: dict[int, list[str]] = {}
    for label, capacity in found:
        grouped.setdefault(capacity, []).append(label)
    return [(", ".join(labels), capacity) for capacity, labels in grouped.items()]


def _gpu_ids(block: Block) -> list[str] | None:
    """The GPU ids a ``gpu`` block names; None for ``gpu *``."""
    tokens = block.opener.tokens[1:] if block.opener else []
    ids = [t.text.strip('"') for t in tokens if t.kind == "STRING"]
    return ids or None


def _quantity(doc: PolicyDocument, outline: Outline, token: Token) -> str | None:
    match = _QUANTITY.fullmatch(token.text)
    if match is None:
        return None
    number_text, unit = match.group(1), match.group(2)
    try:
        number = Fraction(number_text)
    except (ValueError, ZeroDivisionError):
        return None
    block = token.statement.block if token.statement else outline.top
    if unit in SIZE_UNITS:
        n = size_bytes(number, unit)
        lines = [f"**{token.text}** = {n:,} bytes = {_gib(n)}"]
        for label, capacity in _capacities(doc, block):
            if capacity:
                lines.append(f"- {float(Fraction(n * 100, capacity)):.2f}% of {format_bytes(capacity)} ({label})")
        return "\n".join(lines)
    if unit == "%":
        lines = [f"**{number_text}%** of the GPU's capacity"]
        capacities = _capacities(doc, block)
        for label, capacity in capacities:
            n = percent_of(number, capacity)
            lines.append(f"- {label}: {n:,} bytes = {_gib(n)} (of {format_bytes(capacity)})")
        if not capacities:
            lines.append("\nno capacity known: set `kvpolicy.gpuCapacity`, `kvpolicy.facts`, or a `gpu` block's `capacity`")
        return "\n".join(lines)
    if unit in DURATION_UNITS:
        seconds = number * DURATION_UNITS[unit]
        return f"**{token.text}** = {float(seconds):g} s"
    return None


def _gib(n: int) -> str:
    text = f"{n / GiB:,.3f}".rstrip("0").rstrip(".")
    return f"{text} GiB"


# ---- model patterns --------------------------------------------------------------------------


def _model_pattern(doc: PolicyDocument, outline: Outline, token: Token) -> str | None:
    statement = token.statement
    if statement is None or statement.block.kind != "top" or statement.keyword != "model" or statement.tokens[1:2] != [token]:
        return None
    policy = doc.model
    block = _block_at(policy, token) if policy is not None else None
    if policy is None or block is None:
        return None
    pattern = block.name.value
    exact = not any(c in pattern for c in "*?")
    lines = [
        f'**model "{pattern}"**: '
        + ("an exact name: it beats every glob." if exact else
           "a glob (`*` any run, `?` one character). Of the patterns that match an instance's model name, "
           "the most specific binds it: an exact name, then the longest pattern, then the first in the file.")
    ]
    facts = doc.context.facts
    if facts is None:
        outranking = [m for m in policy.models if m is not block and not any(c in m.name.value for c in "*?") and matches(pattern, m.name.value)]
        if outranking:
            lines.append("\nexact names here that it also matches (they bind those instances):")
            lines += [f'- `model "{m.name.value}"` (line {m.span.line})' for m in outranking]
        lines.append("\nno facts to show instances: set `kvpolicy.facts`, or add NAME.facts.json beside the policy")
        return "\n".join(lines)
    source = doc.context.facts_path.name if doc.context.facts_path else "the facts"
    rows: list[str] = []
    for inst in facts.instances:
        if not matches(pattern, inst.model):
            continue
        winner = binding_block(policy, inst.model)
        where = f"`{inst.id}` ({inst.model}, {inst.engine}, {inst.gpu})"
        if winner is not None and winner.span == block.span:
            rows.append(f"- {where}: binds here")
        elif winner is not None:
            rows.append(f'- {where}: matches, but `model "{winner.name.value}"` (line {winner.span.line}) is more specific')
    lines.append(f"\ninstances in {source}:" if rows else f"\nno instance in {source} matches it")
    return "\n".join(lines + rows)


def _block_at(policy: Policy, token: Token) -> ModelBlock | None:
    for block in policy.models:
        span = block.name.span
        if span.line == token.line + 1 and span.col == token.col + 1:
            return block
    return None
