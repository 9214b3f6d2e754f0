"""Helpers the language tests share."""

from __future__ import annotations

import re

from kvpolicy.policy.model import Policy
from kvpolicy.policy.syntax import parse_tree

TERMINAL_NAMES = re.compile(
    r"__ANON|\$END|Token\(|\b_?SEP\b|\b(?:SEMICOLON|LBRACE|RBRACE|LPAR|RPAR|LSQB|RSQB|COMMA|COLON|STAR|"
    r"QUANTITY|NAME|STRING|ATTRIBUTE|COMPARE|COMMENT|NUMBER|WS|NEWLINE|"
    r"VERSION|DEFAULTS|MODEL|RULE|HEADROOM|CAPACITY|CHUNK|ENGINE|PRIORITY|RESERVE|MIN|MAX|WEIGHT|"
    r"POOL|OWNER|WHEN|ORDER|SHRINK|GRACE|COOLDOWN|AND|OR|NOT|TO)\b|_kvpolicy_recovered_|"
    r"\b(?:or_expr|and_expr|not_expr|order_key|gpu_selector|all_gpus|_block|_statement|_loose)\b"
)
"""Names from the grammar or from Lark that must never reach a user."""

_QUOTED = re.compile(r"'[^']*'|`[^`]*`|\"[^\"]*\"")


def shows_terminal_name(text: str) -> bool:
    """Whether ``text`` names a grammar terminal outside what it quotes (a quote is the user's own text)."""
    return bool(TERMINAL_NAMES.search(_QUOTED.sub("", text)))


def semantic_dump(policy: Policy | None) -> object:
    """The policy as data, without what layout changes: spans, the file's hash and name."""

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("span", "sha256", "file")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    assert policy is not None
    return strip(policy.model_dump(mode="json"))


def comment_texts(text: str) -> list[str]:
    """Every comment of a policy that parses, as written (trailing spaces aside)."""
    result = parse_tree(text, "p.kvp")
    assert not result.diagnostics, [d.render() for d in result.diagnostics]
    return [c.value.rstrip() for c in result.comments]
