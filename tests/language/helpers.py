"""Helpers the language tests share, and their Hypothesis settings.

Hypothesis: ``ci`` (the default) is reproducible: derandomized, no example
database, no deadline (CI machines are shared). ``dev`` draws new random examples
on each run and keeps failures in the local database. Pick one with
HYPOTHESIS_PROFILE; scale the number of examples with KVPOLICY_FUZZ_SCALE (e.g. 10
for a long local run). The profiles are neither registered nor loaded: the tests here
start from ``PROFILE`` explicitly, which leaves other packages' property tests as they are.
"""

from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

from kvpolicy.policy.model import Policy
from kvpolicy.policy.syntax import parse_tree

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)
_PROFILES = {
    "ci": settings(derandomize=True, database=None, **_COMMON),
    "dev": settings(**_COMMON),
}
# Not registered under these names: Hypothesis has a built-in "ci" profile of its own
# (without the data_too_large suppression), which would win over a registration.
_CHOSEN = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _CHOSEN not in _PROFILES:
    raise InvalidArgument(f"HYPOTHESIS_PROFILE={_CHOSEN!r}: the language tests know {sorted(_PROFILES)}")
PROFILE = _PROFILES[_CHOSEN]
"""The settings the property tests start from."""


def examples(n: int) -> int:
    """``n`` examples, times KVPOLICY_FUZZ_SCALE."""
    return max(1, int(n * float(os.environ.get("KVPOLICY_FUZZ_SCALE", "1"))))

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
