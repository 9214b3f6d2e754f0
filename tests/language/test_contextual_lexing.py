"""Lark's contextual lexer reads a word as a keyword exactly where the parser takes it.

The contextual lexer reads ``capacity`` as the keyword where the parser state's
table lists it, else as a NAME. An LALR table can list a keyword that only a merged
state takes (a reduction on it that fails further on): there the lexer would read a
keyword and the parser refuse it, where the word was a NAME the parser would take
(``capacity 5`` at the top level is an unknown statement with a did-you-mean, not a
syntax error). The grammar avoids such states; this walks the parser through every
configuration up to a depth and checks that it does.
"""

from __future__ import annotations

import re
from collections import deque

from lark import Token

from kvpolicy.policy.lark_parser import parser

MAX_STACK = 9
"""Deep enough for a pool block in a model block and a condition in parentheses."""


def test_a_keyword_the_parser_lists_but_refuses_is_never_a_name_it_takes() -> None:
    lark = parser()
    keywords = {t.name for t in lark.terminals if t.pattern.type == "str" and re.fullmatch(r"\w+", t.pattern.value)}
    assert {"CAPACITY", "PRIORITY", "TO", "AND"} <= keywords
    start = lark.parse_interactive("")
    queue, seen, problems = deque([start]), set(), []
    while queue:
        ip = queue.popleft()
        stack = tuple(ip.parser_state.state_stack)
        if stack in seen or len(stack) > MAX_STACK:
            continue
        seen.add(stack)
        listed = {t for t in ip.choices() if t.isupper()}
        taken = ip.accepts()
        for keyword in sorted((keywords & listed) - taken):
            if "NAME" in taken:
                problems.append(f"after {stack}: {keyword} is lexed as a keyword the parser refuses, NAME is taken")
        if "NAME" in listed - taken:
            problems.append(f"after {stack}: NAME is listed but refused (the refused word's error comes too late)")
        for terminal in sorted(taken - {"$END"}):
            child = ip.copy(deepcopy_values=False)
            child.feed_token(Token(terminal, "x"))
            queue.append(child)
    assert len(seen) > 1000, "the walk stopped early"
    assert problems == []
