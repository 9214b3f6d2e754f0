"""Completion: what may come next at the cursor.

At the start of a statement, the keywords of the block (settings already written
there are left out: each may appear once); after a number, the units its setting
takes; after ``engine``, ``pool``, ``owner``, ``order``, ``shrink to`` and inside
``when``, the names those take (pool names for the model's engine); inside a
suppression comment, the codes that may be suppressed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpolicy.engines import ANY_ENGINE, ENGINES, pool_vocabulary
from kvpolicy.lsp import reference
from kvpolicy.lsp.documents import PolicyDocument
from kvpolicy.lsp.language import rule_docs, vocabulary as v
from kvpolicy.lsp.positions import Pos, Region
from kvpolicy.lsp.scan import BLOCK_FIELDS, Block, Outline, Token
from kvpolicy.units import BINARY_UNITS, DECIMAL_UNITS, DURATION_UNITS

_PREFIX = re.compile(r"[A-Za-z_%][A-Za-z0-9_.%]*$")
_NUMBER_BEFORE = re.compile(r"(?<![A-Za-z0-9_.])[+-]?(?:\d+(?:\.\d*)?|\.\d+)[ \t]*$")
"""A number just before the cursor (and the unit being typed): not the digits of a word like ``c4``."""
_SUPPRESSION = re.compile(r"#\s*kvpolicy:\s*ignore\[[^\]]*$")
_REPEATABLE = {"top": {"gpu", "model", "rule"}, "model": {"pool"}}
"""Statements that may appear more than once in a block."""

SIZE_SETTINGS = {"headroom": True, "capacity": False, "chunk": False, "reserve": False, "min": True, "max": True}
"""Settings that take a size, and whether a percentage too."""
DURATION_SETTINGS = ("grace", "cooldown")


@dataclass(frozen=True)
class Item:
    label: str
    kind: str
    """``keyword``, ``unit``, ``value``, ``attribute``, ``code``: the client's icon."""
    detail: str | None = None
    documentation: str | None = None
    sort: str | None = None


@dataclass(frozen=True)
class Completions:
    items: list[Item]
    replace: Region
    """What a chosen item replaces: the part of the word already typed."""


def complete(doc: PolicyDocument, pos: Pos) -> Completions:
    outline = doc.outline
    offset = outline.offset(pos.line, pos.col)
    line_text = outline.text[outline.line_starts[pos.line] : offset] if pos.line < len(outline.line_starts) else ""
    prefix = _PREFIX.search(line_text)
    typed = prefix.group() if prefix else ""
    replace = Region.on_line(pos.line, pos.col - len(typed), pos.col)
    token = outline.token_at(offset)
    if token is not None and token.kind == "COMMENT":
        return Completions(_suppressible_codes(), _word_region(pos, line_text)) if _SUPPRESSION.search(line_text) else Completions([], replace)
    if token is not None and token.kind == "STRING" and token.offset < offset < token.end:
        return Completions([], replace)
    before = line_text[: len(line_text) - len(typed)]
    block = outline.block_at(offset)
    number = _NUMBER_BEFORE.search(before)
    if number:
        statement = outline.tokens_before(offset - len(line_text) + number.start())
        return Completions(_units(statement, doc), replace)
    tokens = outline.tokens_before(offset - len(typed))
    return Completions(_after(doc, outline, block, tokens), replace)


def _word_region(pos: Pos, line_text: str) -> Region:
    word = re.search(r"[A-Za-z0-9]*$", line_text)
    return Region.on_line(pos.line, pos.col - len(word.group() if word else ""), pos.col)


def _after(doc: PolicyDocument, outline: Outline, block: Block, tokens: list[Token]) -> list[Item]:
    if not tokens:
        return _keywords(block)
    words = [t.text for t in tokens]
    head = words[0]
    if block.kind == "top" and head == "version" and len(words) == 1:
        return [Item("1", "value", "the language version")]
    if block.kind == "top" and head == "gpu" and len(words) == 1:
        return [Item("*", "value", "every GPU"), *_gpu_ids(doc)]
    if block.kind == "top" and head == "model" and len(words) == 1:
        return _model_names(doc, outline)
    if block.kind == "model" and head == "engine" and len(words) == 1:
        return [Item(name, "value", "engine") for name in (*ENGINES, ANY_ENGINE)]
    if block.kind == "model" and head == "pool" and len(words) == 1:
        engine = _setting_value(block, "engine")
        taken = {c.name.text for c in block.children if c.kind == "pool" and c.name is not None}
        return [Item(p, "value", f"pool of {engine or 'any engine'}") for p in sorted(pool_vocabulary(engine)) if p not in taken]
    if block.kind == "pool" and head == "owner" and len(words) == 1:
        return [Item(o, "value", "owner") for o in v.OWNERS]
    if block.kind == "rule":
        return _rule(head, words, tokens)
    return []


def _rule(head: str, words: list[str], tokens: list[Token]) -> list[Item]:
    if head == "shrink":
        if len(words) == 1:
            return [Item("to", "keyword", "shrink to min | target | SIZE | PERCENT")]
        if words[1:] == ["to"]:
            return [Item(t, "value", "rule action: shrink the instances it selects to this") for t in v.SHRINK_TARGETS]
        return []
    if head == "order":
        if words[-1] in ("order", ","):
            return [_attribute(f"model.{key}", key) for key in v.ORDER_KEYS]
        if tokens[-1].kind == "NAME" and words[-1] in v.ORDER_KEYS:
            return [Item(d, "value", "direction") for d in v.DIRECTIONS]
        return []
    if head == "when":
        last = tokens[-1]
        if last.text in ("when", "(", "and", "or", "not"):
            return [_attribute(a, a) for a in v.ATTRIBUTES] + [Item("not", "keyword")]
        if last.kind == "COMPARE" and len(tokens) >= 2:
            left = tokens[-2].text
            if left == "model.engine":
                return [Item(name, "value", "engine") for name in (*ENGINES, ANY_ENGINE)]
            return []
        if last.kind != "COMPARE" and len(tokens) >= 3 and tokens[-2].kind == "COMPARE":
            return [Item(w, "keyword") for w in ("and", "or")]
    return []


def _attribute(name: str, label: str) -> Item:
    entries = reference.entries_for(name)
    return Item(label, "attribute", f"{name}: {v.ATTRIBUTES[name]}", entries[0].markdown() if entries else None)


def _keywords(block: Block) -> list[Item]:
    fields = BLOCK_FIELDS.get(block.kind, ())
    present = block.keywords()
    repeatable = _REPEATABLE.get(block.kind, set())
    items = []
    for index, word in enumerate(fields):
        if word in present and word not in repeatable:
            continue
        entries = reference.entries_for(word)
        if len(entries) > 1:
            own = set(fields)
            entries = [max(entries, key=lambda e: len(own & set(e.siblings)))]
        items.append(Item(word, "keyword", f"{block.kind if block.kind != 'top' else 'top-level'} statement",
                          entries[0].markdown() if entries else None, sort=f"{index:02d}"))
    return items


def _setting_value(block: Block, keyword: str) -> str | None:
    statement = block.setting(keyword)
    return statement.tokens[1].text if statement is not None and len(statement.tokens) > 1 else None


def _units(statement: list[Token], doc: PolicyDocument) -> list[Item]:
    """The units a number at the end of ``statement`` may take."""
    head = statement[0].text if statement else None
    sizes = [Item(u, "unit", "binary size unit", sort=f"0{i}") for i, u in enumerate(BINARY_UNITS)]
    sizes += [Item(u, "unit", "decimal size unit (warning KV019)", sort=f"2{i}") for i, u in enumerate(DECIMAL_UNITS)]
    percent = [Item("%", "unit", "of the GPU's capacity", sort="1")]
    durations = [Item(u, "unit", "duration unit", sort=f"0{i}") for i, u in enumerate(DURATION_UNITS)]
    if head in SIZE_SETTINGS:
        return sizes + (percent if SIZE_SETTINGS[head] else [])
    if head in DURATION_SETTINGS:
        return durations
    if head == "shrink":
        return sizes + percent
    if head == "when":
        attributes = [t.text for t in statement if t.kind == "ATTRIBUTE"]
        kind = v.ATTRIBUTES.get(attributes[-1]) if attributes else None
        if kind == "size":
            return sizes + percent
        if kind == "duration":
            return durations
        if kind is None:
            return sizes + percent + durations
    return []


def _gpu_ids(doc: PolicyDocument) -> list[Item]:
    facts = doc.context.facts
    return [Item(f'"{g.id}"', "value", f"GPU in the facts ({g.capacity:,} bytes)") for g in facts.gpus] if facts else []


def _model_names(doc: PolicyDocument, outline: Outline) -> list[Item]:
    facts = doc.context.facts
    if facts is None:
        return []
    written = {b.name.text.strip('"') for b in outline.models() if b.name is not None}
    names = dict.fromkeys(i.model for i in facts.instances if i.model not in written)
    return [Item(f'"{name}"', "value", "model in the facts") for name in names]


def _suppressible_codes() -> list[Item]:
    return [Item(d.code, "code", d.name, d.summary) for d in rule_docs() if d.suppressible]
