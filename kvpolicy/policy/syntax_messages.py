"""Syntax errors in the user's words.

The parser knows which token it did not expect and which it would have taken;
this module turns that into a message about the policy ("'priority' needs a
number"), never about the grammar (no terminal names), placed where the fix
goes (a missing value: right after the keyword that needs it), and a hint.

``MATCHERS`` is a table, in the spirit of Lark's ``match_examples``: each matcher
is a kind of error, a predicate on the ``Situation`` (the refused token, what the
parser would have taken, the tokens before it, the blocks and parentheses open),
what it reports, and inputs that produce it. The first matcher whose predicate
holds explains the error; the last holds for any. The tests parse every example
and check that its own matcher is the one that answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property

from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from kvpolicy.catalogue import SYNTAX_ERROR, UNKNOWN_FIELD, UNKNOWN_UNIT, Rule
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.policy.build import BLOCK_FIELDS, unknown_keyword
from kvpolicy.policy.lark_parser import NestingTooDeep, Token, Trace, parser
from kvpolicy.policy.vocabulary import EXPONENT_HINT, RECOVERED, UNIT_ALIASES

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

EXAMPLES = {
    "version": "version 1",
    "headroom": "headroom 2 GiB",
    "capacity": "capacity 141 GiB",
    "chunk": "chunk 2 MiB",
    "engine": "engine vllm",
    "priority": "priority 100",
    "reserve": "reserve 40 GiB",
    "min": "min 2 GiB",
    "max": "max 40%",
    "weight": "weight 100",
    "owner": "owner runtime",
    "pool": "pool swa { owner runtime }",
    "when": "when gpu.free < 8 GiB and model.idle > 60s",
    "order": "order priority asc, idle desc",
    "shrink": "shrink to min",
    "to": "shrink to min",
    "grace": "grace 30s",
    "cooldown": "cooldown 2m",
    "model": 'model "qwen3-*" { ... }',
    "rule": 'rule "idle-reclaim" { ... }',
    "gpu": 'gpu "cuda:0" { ... }',
    "defaults": "defaults { headroom 2 GiB }",
    "and": "when gpu.free < 8 GiB and model.idle > 60s",
    "or": "when gpu.free < 8 GiB or model.idle > 10m",
    "not": "when not model.engine == vllm",
}
"""A correct statement of each keyword, for hints."""

_TOKEN_WORDS = {
    "QUANTITY": "a number",
    "STRING": "a quoted string",
    "NAME": "a name",
    "ATTRIBUTE": "an attribute such as gpu.free",
    "_SEP": "the end of the statement",
    "COMPARE": "a comparison (<, <=, >, >=, ==, !=)",
    "$END": "the end of the file",
}
_VALUE_WORDS = {
    "version": "a version number",
    "priority": "a number",
    "weight": "a number",
    "reserve": "a size",
    "capacity": "a size",
    "chunk": "a size",
    "headroom": "a size or a percentage",
    "min": "a size or a percentage",
    "max": "a size or a percentage",
    "grace": "a duration",
    "cooldown": "a duration",
}
"""What each setting's number is, for "'grace' needs a duration"."""
_VALUE_TYPES = {"QUANTITY", "STRING", "NAME", "ATTRIBUTE", "STAR", "LPAR", "NOT"}
_STATEMENT_END = {"_SEP", "RBRACE", "$END"}


@dataclass(frozen=True)
class Failure:
    """What one syntax error reports, and how parsing goes on."""

    diagnostic: Diagnostic
    recover_line: int | None
    """The line to replace before parsing again; None: stop reporting."""
    replacement: str | None = None
    """What replaces that line; None: a placeholder that keeps its braces balanced."""
    also: tuple[Diagnostic, ...] = ()
    """More errors found at once (e.g. several blocks left open at the end)."""


class Situation:
    """One syntax error as the matchers see it."""

    def __init__(self, error: Exception, trace: Trace, lines: list[str], file: str) -> None:
        self.error = error
        self.trace = trace
        self.lines = lines
        self.file = file
        self.history = trace.history
        """The tokens the parser took, in order."""
        self.previous: Token | None = self.history[-1] if self.history else None
        """The last of them."""
        self.expected: set[str] = set()
        """The terminals the parser would have taken instead."""
        if isinstance(error, UnexpectedToken):
            self.token = _as_keyword(error.token)
            self.expected = set(error.accepts or error.expected)
            if self.previous is not None and self.previous.type == "_SEP":
                # the postlexer merges a run of separators into one, so after one the user
                # may always write another: the grammar has no need to say so
                self.expected.add("_SEP")
        elif isinstance(error, NestingTooDeep):
            self.token = error.token
        self.at_end = isinstance(error, UnexpectedToken) and self.token.type == "$END"

    # ---- what the matchers read ----------------------------------------------------------

    @property
    def prev_word(self) -> str:
        return self.previous.value if self.previous is not None else ""

    @property
    def example(self) -> str | None:
        """``e.g. `priority 100``` for the keyword before the error, if it has an example."""
        example = EXAMPLES.get(self.prev_word)
        return f"e.g. `{example}`" if example else None

    @property
    def value_missing(self) -> bool:
        """The statement ends where the parser wanted a value."""
        return (
            self.token.type in _STATEMENT_END
            and bool(self.expected & _VALUE_TYPES)
            and not self.expected & {"_SEP", "RBRACE"}
        )

    def fail(
        self,
        span: Span,
        message: str,
        hint: str | None = None,
        recover: int | bool = True,
        replacement: str | None = None,
        rule: Rule = SYNTAX_ERROR,
    ) -> Failure:
        """Report ``message`` under ``rule`` (a few errors have a rule of their own) and go on
        parsing with the refused token's line replaced (``recover``: another line, or
        False to stop)."""
        line = (None if self.at_end else self.token.line) if recover is True else (recover or None)
        return Failure(rule.at(self.file, span, message, hint), line, replacement)

    def after(self, token: Token) -> Span:
        """The point just after ``token``: where a missing value belongs."""
        return Span.point(token.end_line or token.line, token.end_column or token.column + len(token.value))

    def setting(self, word: str) -> str:
        """How a message names the statement that needs a value."""
        return "'shrink to'" if word == "to" else f"'{word}'"

    def words(self, types: set[str] | None = None) -> str:
        """What the parser expected (by default: ``expected``), in the language's words."""
        return describe(self.expected if types is None else types, self.previous)

    def statement_head(self) -> Token | None:
        """The first token of the statement being parsed (``model``, ``rule``...)."""
        head = None
        for token in reversed(self.history):
            if token.type == "_SEP" or token.value in ("{", "}"):
                break
            head = token
        return head

    @cached_property
    def forgotten_braces(self) -> tuple[list[tuple[Token, Token | None]], int] | None:
        """The blocks a ``model``/``rule``/``gpu``/``defaults`` statement opened inside a
        block shows left open, and the line their '}' belongs before (None: no such
        statement). A statement indented no deeper than the enclosing ones means their
        '}' was forgotten above it; one indented deeper is nested on purpose (the builder
        says it cannot be there)."""
        for head, around in self.trace.nested_heads:
            unclosed = [(brace, outer) for brace, outer in around if (outer or brace).column >= head.column]
            if not unclosed:
                continue
            where = head.line
            # Indentation may place the forgotten '}' higher up (a pool's, closing its
            # model too early): trust it when it accounts for as many blocks.
            found = [
                (brace, outer, line) for brace, outer, line in self.unclosed_by_indentation()
                if brace.start_pos < head.start_pos and line is not None and line <= head.line
            ]
            if len(found) == len(unclosed):
                where = min(line for _, _, line in found)
                unclosed = [(brace, outer) for brace, outer, line in found if line == where]
            return unclosed, where
        return None

    def unclosed_by_indentation(self) -> list[tuple[Token, Token | None, int | None]]:
        """Blocks whose '}' is not where their indentation says it should be:
        (its '{', its statement, the line the '}' belongs before; None: the end)."""
        found = []
        for brace, head in self.trace.blocks:
            close = self.trace.closed_by.get(brace.start_pos)
            if close is not None and close.line == brace.line:
                continue  # a block on one line
            indent = (head or brace).column
            line = self.first_line_at_or_left_of(indent, brace.line)
            closes_there = (
                line is not None
                and self.lines[line - 1].lstrip().startswith("}")
                and _indent(self.lines[line - 1]) == indent
            )
            if close is None:
                if not closes_there:
                    found.append((brace, head, line))
            elif line is not None and close.line >= line and not closes_there:
                found.append((brace, head, line))
        return found

    def first_line_at_or_left_of(self, column: int, after: int) -> int | None:
        """The first line after ``after`` with code that starts at or left of ``column``."""
        for number in range(after + 1, len(self.lines) + 1):
            text = self.lines[number - 1]
            stripped = text.lstrip()
            if not stripped or stripped.startswith("#"):
                continue
            if _indent(text) <= column:
                return number
        return None

    def last_code_line(self, first: int, before: int) -> int:
        """The last line from ``first`` up to (not including) ``before`` that has code."""
        for number in range(before - 1, first - 1, -1):
            if self.code(number).strip():
                return number
        return first

    def code(self, number: int) -> str:
        """Line ``number`` without its comment."""
        text = self.lines[number - 1]
        for comment in self.trace.comments:
            if comment.line == number:
                return text[: comment.column - 1].rstrip()
        return text.rstrip()

    @cached_property
    def misplaced(self) -> tuple[Token, Token | None] | None:
        """An error inside a statement whose first word the block does not take: (that
        word, the block's statement). That word is the mistake: a typo, or a setting of
        another block."""
        head = self.statement_head()
        if head is None or head.type != "NAME" or head.value == RECOVERED:
            return None
        block_head = self.trace.open_braces[-1][1] if self.trace.open_braces else None
        if block_head is not None and (block_head.type == "NAME" or block_head.value not in BLOCK_FIELDS):
            return None  # inside an unknown block: that block's keyword is reported
        return head, block_head


# ---- the matchers, in the order they are tried ---------------------------------------------


@dataclass(frozen=True)
class Matcher:
    kind: str
    """What ``SyntaxResult.kinds`` says for this error (golden cases are named after it)."""
    error: type[Exception]
    """The exception it explains: an UnexpectedToken from the parser, or the lexer's errors."""
    applies: Callable[[Situation], bool]
    explain: Callable[[Situation], Failure]
    examples: tuple[str, ...]
    """Policies whose first syntax error this matcher explains."""


def _too_deep(s: Situation) -> Failure:
    error = s.error
    assert isinstance(error, NestingTooDeep)  # the matcher's kind of error
    return s.fail(_span(error.token), error.what, "flatten the structure", recover=False)


def _unterminated_string(s: Situation) -> Failure:
    error = s.error
    assert isinstance(error, UnexpectedCharacters)  # the matcher's kind of error
    span = Span.point(error.line, error.column)
    return Failure(SYNTAX_ERROR.at(s.file, span, "unterminated string", 'close the string with " on the same line'), error.line)


_BAD_CHARACTER_HINTS = {
    "/": "comments start with '#'",
    "'": 'strings are in double quotes: "qwen3-8b"',
    "=": "settings take no '=' (`reserve 40 GiB`); in `when`, compare with '=='",
    ":": "settings take no ':' (`reserve 40 GiB`); GPU ids are quoted (\"cuda:0\")",
    "[": 'a list of GPUs is written `gpu "cuda:0", "cuda:1" { ... }`',
    "]": 'a list of GPUs is written `gpu "cuda:0", "cuda:1" { ... }`',
    "&": "write 'and'",
    "|": "write 'or'",
    "!": "write 'not', or '!=' to compare",
    "\r": "this line ends in a carriage return alone (classic Mac OS line endings): save the file with LF line endings",
}


def _bad_character(s: Situation) -> Failure:
    error = s.error
    assert isinstance(error, UnexpectedCharacters)  # the matcher's kind of error
    char = error.char
    if not char.isprintable() or char.isspace():
        shown = f"U+{ord(char):04X}"
    else:
        shown = f'"{char}"' if char == "'" else f"'{char}'"
    span = Span.point(error.line, error.column)
    diagnostic = SYNTAX_ERROR.at(s.file, span, f"unexpected character {shown}", _BAD_CHARACTER_HINTS.get(char))
    return Failure(diagnostic, error.line)


def _missing_close_paren(s: Situation) -> Failure:
    paren = s.trace.open_parens[-1]
    return s.fail(
        s.after(s.previous) if s.previous else _span(s.token),
        f"missing ')' to close the '(' at {paren.line}:{paren.column}",
        "close every '(' with ')'", recover=paren.line,
    )


def _forgotten_close_brace(s: Situation) -> Failure:
    """Recovery closes the blocks at the end of the last line of code before the
    statement, so the statements below are read (and checked) where they belong."""
    forgotten = s.forgotten_braces
    assert forgotten is not None  # the matcher applies only then
    unclosed, where = forgotten
    last = s.last_code_line(unclosed[-1][0].line, where)
    return s.fail(
        Span.point(where, _indent(s.lines[where - 1])),
        _missing_braces_message(unclosed, f"before line {where}"),
        _missing_braces_hint(unclosed, s.trace.recovered_lines),
        recover=last, replacement=s.code(last) + " }" * len(unclosed),
    )


def _missing_close_brace_at_end(s: Situation) -> Failure:
    """Indentation tells where a block was meant to end (the first later line indented
    no deeper than its statement); where that reading accounts for every open block,
    each gets its own error. Otherwise the innermost open block gets one."""
    open_now = s.trace.open_braces
    found = s.unclosed_by_indentation()
    if len(found) != len(open_now):
        brace, head = open_now[-1]
        found = [(brace, head, s.first_line_at_or_left_of((head or brace).column, brace.line))]
    by_place: dict[int | None, list[tuple[Token, Token | None]]] = {}
    for brace, head, line in found:
        by_place.setdefault(line, []).append((brace, head))
    diagnostics = []
    for line, blocks in sorted(by_place.items(), key=lambda item: item[0] or len(s.lines) + 1):
        blocks.sort(key=lambda block: block[0].start_pos)
        if line is None:
            span, where = _end_of_text(s.lines), "at the end of the file"
        else:
            span, where = Span.point(line, _indent(s.lines[line - 1])), f"before line {line}"
        message = _missing_braces_message(blocks, where)
        diagnostics.append(SYNTAX_ERROR.at(s.file, span, message, _missing_braces_hint(blocks, s.trace.recovered_lines)))
    return Failure(diagnostics[0], None, also=tuple(diagnostics[1:]))


def _misplaced_statement(s: Situation) -> Failure:
    misplaced = s.misplaced
    assert misplaced is not None  # the matcher applies only then
    head, block_head = misplaced
    message, hint = unknown_keyword(head.value, block_head.value if block_head is not None else None)
    return s.fail(_span(head), message, hint, rule=UNKNOWN_FIELD)


def _missing_operand(s: Situation) -> Failure:
    assert s.previous is not None  # the matcher applies only after a token
    return s.fail(s.after(s.previous), f"missing a value after '{s.prev_word}'", "e.g. `gpu.free < 8 GiB`")


def _missing_value(s: Situation) -> Failure:
    assert s.previous is not None  # the matcher applies only after a token
    return s.fail(s.after(s.previous), f"{s.setting(s.prev_word)} needs {s.words()}", s.example)


def _missing_selector(s: Situation) -> Failure:
    return s.fail(
        _span(s.token), f"'gpu' needs a selector, found {_found(s.token)}",
        'use `gpu * { ... }` for every GPU, or `gpu "cuda:0", "cuda:1" { ... }`',
    )


def _is_wrong_value(s: Situation) -> bool:
    """A value of the wrong kind after a keyword (not a quoting slip: those have their own)."""
    quoting = (s.expected == {"STRING"} and s.token.type == "NAME") or (s.expected == {"NAME"} and s.token.type == "STRING")
    return (
        s.previous is not None and s.prev_word in EXAMPLES and s.expected <= _VALUE_TYPES
        and s.token.type not in _STATEMENT_END and not quoting
    )


def _wrong_value(s: Situation) -> Failure:
    return s.fail(_span(s.token), f"{s.setting(s.prev_word)} needs {s.words()}, found {_found(s.token)}", s.example)


def _unquoted_name(s: Situation) -> Failure:
    """``model qwen3-8b {``: the name as written (up to the '{'), and a recovery that
    quotes it, so the block's body is still read and checked."""
    token, keyword = s.token, s.prev_word
    line = s.lines[token.line - 1]
    start = token.column - 1
    name = re.match(r"[^\s{]+", line[start:])
    assert name is not None  # the refused token, a name, starts there
    word = name.group()
    rest = line[start + len(word) :]
    # Quoting shifts what follows by two columns: only when nothing else can be reported there.
    replacement = line[:start] + f'"{word}"' + rest if rest.strip() in ("{", "{}") else None
    span = Span(line=token.line, col=token.column, end_line=token.line, end_col=token.column + len(word))
    return s.fail(
        span, f'names are quoted strings: write "{word}"',
        f'e.g. `{keyword} "{word}" {{ ... }}`', replacement=replacement,
    )


def _missing_open_brace(s: Situation) -> Failure:
    token, previous = s.token, s.previous
    head = s.statement_head()
    keyword = head.value if head is not None and head.type != "NAME" else None
    # by identity: tokens compare equal by their text, and an earlier 'model' is not this one
    start = next((i for i in range(len(s.history) - 1, -1, -1) if s.history[i] is head), None)
    header = " ".join(t.value for t in s.history[start:] if t.type != "_SEP") if start is not None else ""
    rest = "\n".join(s.lines[token.line :]) if not s.at_end else ""
    # A block body follows (its '}' is below): parse it as a block, so its
    # lines are not reported again as statements out of place.
    body_follows = token.type == "_SEP" and rest.count("}") > rest.count("{")
    hint: str | None
    if keyword == "gpu" and token.type == "STRING":
        hint = 'separate GPU ids with commas: `gpu "cuda:0", "cuda:1" { ... }`'
    else:
        hint = f"e.g. `{header} {{`" if header else None
    return s.fail(
        s.after(previous) if previous is not None and token.type in _STATEMENT_END else _span(token),
        f"expected '{{' to open the {keyword} block, found {_found(token)}" if keyword
        else f"expected '{{', found {_found(token)}",
        hint, replacement=f"{RECOVERED} {{" if body_follows else "",
    )


def _quoted_word(s: Situation) -> Failure:
    bare = s.token.value.strip('"')
    return s.fail(
        _span(s.token), f"'{s.prev_word}' takes a bare name, not a quoted string",
        f"write `{s.prev_word} {bare}`" if _WORD.fullmatch(bare) else s.example,
    )


def _unmatched_close_paren(s: Situation) -> Failure:
    return s.fail(_span(s.token), "unmatched ')'", "remove it, or add the '(' it closes")


def _unmatched_close_brace(s: Situation) -> Failure:
    return s.fail(_span(s.token), "unmatched '}'", "remove it, or look above for a '}' too many")


def _missing_to(s: Situation) -> Failure:
    return s.fail(_span(s.token), f"expected 'to' after 'shrink', found {_found(s.token)}", "e.g. `shrink to min`")


def _chained_comparison(s: Situation) -> Failure:
    return s.fail(
        _span(s.token), f"comparisons cannot be chained: unexpected '{s.token.value}'",
        "join two comparisons with 'and', e.g. `gpu.free > 1 GiB and gpu.free < 8 GiB`",
    )


def _is_keyword_as_unit(s: Situation) -> bool:
    """``grace 5 min``: a keyword is never read as a unit, so this is not one quantity."""
    previous = s.previous
    return (
        previous is not None and previous.type == "QUANTITY" and previous.value[-1:].isdigit()
        and s.token.value in UNIT_ALIASES and s.token.line == previous.line
    )


def _keyword_as_unit(s: Situation) -> Failure:
    assert s.previous is not None  # the matcher applies only after a quantity
    unit = UNIT_ALIASES[s.token.value]
    return s.fail(
        _span(s.token), f"unknown unit '{s.token.value}'",
        f"did you mean '{unit}'? (`{s.previous.value}{unit}`)", rule=UNKNOWN_UNIT,
    )


_EXPONENT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)[eE]\d*")  # 1e3, or 1e before -3


def _is_exponent(s: Situation) -> bool:
    """``min 1e3 MiB``: ``1e3`` lexes as a number with the unit ``e3``, and the real unit follows
    (``1e-3 GiB``: ``1e``, then ``-3``)."""
    return s.previous is not None and s.previous.type == "QUANTITY" and _EXPONENT.fullmatch(s.previous.value) is not None


def _exponent(s: Situation) -> Failure:
    assert s.previous is not None  # the matcher applies only after a quantity
    return s.fail(
        _span(s.previous), f"'{s.previous.value}' is not a number here: numbers are written without an exponent",
        EXPONENT_HINT, rule=UNKNOWN_UNIT,
    )


def _is_json_document(s: Situation) -> bool:
    """The file opens with '{': a JSON document (facts, a policy test) given where a policy goes."""
    return s.token.type == "LBRACE" and all(token.type == "_SEP" for token in s.history)


def _json_document(s: Situation) -> Failure:
    return s.fail(
        _span(s.token), "this looks like a JSON document, not a policy",
        "a policy starts with `version 1`; a facts file goes after `--facts`, a policy test to `kvpolicy test`",
        recover=False,  # every line after would be an error of its own
    )


def _two_statements(s: Situation) -> Failure:
    return s.fail(
        _span(s.token), f"expected the end of the statement after '{s.prev_word}', found {_found(s.token)}",
        "put one statement per line, or separate statements with ';'",
    )


def _unexpected(s: Situation) -> Failure:
    return s.fail(
        _span(s.token) if not s.at_end else _end_of_text(s.lines),
        f"unexpected {_found(s.token)}; expected {s.words()}",
        "e.g. `gpu.free < 8 GiB`" if "COMPARE" in s.expected else None,
    )


def _head_type(s: Situation) -> str | None:
    head = s.statement_head()
    return head.type if head is not None else None


MATCHERS: tuple[Matcher, ...] = (
    Matcher(
        "too-deep", NestingTooDeep, lambda s: True, _too_deep,
        ('version 1\nrule "r" { when ' + "not " * 40 + "gpu.free < 1 GiB }\n",
         'version 1\nrule "r" { when ' + "(" * 40 + "gpu.free < 1 GiB" + ")" * 40 + " }\n"),
    ),
    Matcher(
        "unterminated-string", UnexpectedCharacters,
        lambda s: isinstance(s.error, UnexpectedCharacters) and s.error.char == '"', _unterminated_string,
        ('version 1\nmodel "a\n',),
    ),
    Matcher("bad-character", UnexpectedCharacters, lambda s: True, _bad_character, ('version 1\nmodel "a" { reserve 40 @ }\n',)),
    Matcher("json-document", UnexpectedToken, _is_json_document, _json_document, ('{\n  "gpus": []\n}\n',)),
    Matcher(
        "missing-close-paren", UnexpectedToken,
        lambda s: bool(s.trace.open_parens) and "RPAR" in s.expected and not s.expected & _VALUE_TYPES,
        _missing_close_paren,
        ('version 1\nrule "r" {\n  when (gpu.free < 8 GiB\n  shrink to min\n}\n',),
    ),
    Matcher(
        "missing-close-brace-before", UnexpectedToken, lambda s: s.forgotten_braces is not None, _forgotten_close_brace,
        ('version 1\nmodel "a" {\n  priority 1\nmodel "b" {}\n',
         'version 1\nmodel "a" {\n  priority 1\nrule "r" {\n  when gpu.free < 1 GiB\n}\n'),
    ),
    Matcher(
        "missing-close-brace", UnexpectedToken,
        lambda s: s.at_end and "RBRACE" in s.expected and bool(s.trace.open_braces),
        _missing_close_brace_at_end,
        ('version 1\nmodel "a" {\n  priority 1\n',
         'version 1\nmodel "a" {\n  pool swa {\n    owner runtime\n\n  priority 1\n}\n'),
    ),
    Matcher(
        "misplaced-statement", UnexpectedToken, lambda s: s.misplaced is not None, _misplaced_statement,
        ('version 1\nmodel "a" { when gpu.free < 8 GiB }\n', 'version 1\nrule "r" {\n  whn gpu.free < 8 GiB\n}\n'),
    ),
    Matcher(
        "missing-operand", UnexpectedToken,
        lambda s: s.value_missing and s.previous is not None and s.previous.type == "COMPARE",
        _missing_operand,
        ('version 1\nrule "r" {\n  when gpu.free <\n}\n',),
    ),
    Matcher(
        "missing-value", UnexpectedToken,
        lambda s: s.value_missing and s.previous is not None and s.previous.type != "_SEP",
        _missing_value,
        ('version 1\nmodel "a" {\n  priority\n}\n', "version 1\ngpu * { headroom }\n"),
    ),
    Matcher(
        "missing-selector", UnexpectedToken, lambda s: s.expected == {"STRING", "STAR"}, _missing_selector,
        ("version 1\ngpu { headroom 1 GiB }\n",),
    ),
    Matcher(
        "wrong-value", UnexpectedToken, _is_wrong_value, _wrong_value,
        ('version 1\nmodel "a" { engine 5 }\n', 'version 1\nrule "r" { order , }\n'),
    ),
    Matcher(
        "unquoted-name", UnexpectedToken, lambda s: s.expected == {"STRING"} and s.token.type == "NAME", _unquoted_name,
        ("version 1\nmodel qwen {\n}\n", "version 1\nrule idle { }\n"),
    ),
    Matcher(
        "missing-open-brace", UnexpectedToken,
        lambda s: "LBRACE" in s.expected and not s.expected & (_VALUE_TYPES - {"STRING"}),
        _missing_open_brace,
        ('version 1\nmodel "a"\n  priority 1\n',),
    ),
    Matcher(
        "quoted-word", UnexpectedToken, lambda s: s.expected == {"NAME"} and s.token.type == "STRING", _quoted_word,
        ('version 1\nmodel "a" { engine "vllm" }\n',),
    ),
    Matcher(
        "unmatched-close-paren", UnexpectedToken,
        lambda s: s.token.type == "RPAR" and not s.trace.open_parens, _unmatched_close_paren,
        ('version 1\nrule "r" { when gpu.free < 8 GiB) }\n',),
    ),
    Matcher(
        "unmatched-close-brace", UnexpectedToken,
        lambda s: s.token.type == "RBRACE" and not s.trace.open_braces, _unmatched_close_brace,
        ("version 1\n}\n",),
    ),
    Matcher(
        "missing-to", UnexpectedToken, lambda s: s.prev_word == "shrink" and "TO" in s.expected, _missing_to,
        ('version 1\nrule "r" { shrink min }\n',),
    ),
    Matcher(
        "chained-comparison", UnexpectedToken,
        lambda s: s.token.type == "COMPARE" and "_SEP" in s.expected and _head_type(s) == "WHEN",
        _chained_comparison,
        ('version 1\nrule "r" { when 1 GiB < gpu.free < 8 GiB }\n',),
    ),
    Matcher("keyword-as-unit", UnexpectedToken, _is_keyword_as_unit, _keyword_as_unit, ('version 1\nrule "r" { grace 5 min }\n',)),
    Matcher("exponent", UnexpectedToken, _is_exponent, _exponent, ('version 1\nmodel "a" { min 1e3 MiB }\n',)),
    Matcher(
        "two-statements", UnexpectedToken,
        # after a separator a new statement starts: the refused token is no second statement
        lambda s: (
            "_SEP" in s.expected and s.token.type not in _STATEMENT_END
            and s.previous is not None and s.previous.type != "_SEP"
        ),
        _two_statements,
        ('version 1\nmodel "a" { priority 1 weight 2 }\n', 'version 1\nrule "r" { when gpu.free < 8 GiB gpu.used }\n'),
    ),
    Matcher("unexpected", UnexpectedToken, lambda s: True, _unexpected, ('version 1\nrule "r" { when gpu.free 5 }\n',)),
)

ERROR_EXAMPLES: dict[str, tuple[str, ...]] = {matcher.kind: matcher.examples for matcher in MATCHERS}
"""Each kind of syntax error with inputs that produce it."""


def explain_failure(error: Exception, trace: Trace, lines: list[str], file: str) -> tuple[Matcher, Failure]:
    """The first matcher that explains ``error``, and what it reports."""
    situation = Situation(error, trace, lines, file)
    for matcher in MATCHERS:
        if isinstance(error, matcher.error) and matcher.applies(situation):
            return matcher, matcher.explain(situation)
    raise TypeError(f"no matcher explains {type(error).__name__}")  # the last of each kind takes any


# ---- words --------------------------------------------------------------------------------------


def describe(types: set[str], previous: Token | None) -> str:
    """What the parser expected, in the language's words (``previous``: the token before)."""
    if previous is not None and previous.type == "TO":
        return "min, target, a size or a percentage"
    if types == {"NAME", "ATTRIBUTE"}:  # only `order` takes both, and only to refuse the attribute
        return "an attribute's short name such as `priority` or `idle`"
    if "ATTRIBUTE" in types and "COMPARE" not in types:
        return "a condition such as `gpu.free < 8 GiB`"
    if types == {"QUANTITY"} and previous is not None and previous.value in _VALUE_WORDS:
        return _VALUE_WORDS[previous.value]
    terminals = {t.name: t.pattern.value for t in parser().terminals}
    keywords = sorted(terminals[t] for t in types if t in terminals and _WORD.fullmatch(str(terminals[t])))
    words: list[str] = []
    if len(keywords) > 3:
        words.append("a setting such as " + ", ".join(f"'{k}'" for k in keywords[:3]))
    else:
        words.extend(f"'{k}'" for k in keywords)
    for t in sorted(types):
        if t == "NAME" and len(keywords) > 3:
            continue  # "a setting such as ..." says a name goes here
        if t in _TOKEN_WORDS:
            words.append(_TOKEN_WORDS[t])
        elif t in terminals and not _WORD.fullmatch(str(terminals[t])):
            words.append(f"'{terminals[t]}'")
    if not words:
        return "something else"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@cache
def _keywords() -> dict[str, str]:
    """Each keyword's terminal by its spelling (``priority`` → ``PRIORITY``)."""
    return {
        t.pattern.value: t.name
        for t in parser().terminals
        if t.pattern.type == "str" and _WORD.fullmatch(t.pattern.value)
    }


def _as_keyword(token: Token) -> Token:
    """The refused token, a keyword if it is spelled as one.

    The lexer reads a keyword as a NAME where the parser cannot take that keyword; when
    the parser cannot take a NAME there either, the word is better explained as the
    keyword it is (``'model' needs a quoted string, found 'max'``).
    """
    keyword = _keywords().get(token.value) if token.type == "NAME" else None
    return token if keyword is None else Token.new_borrow_pos(keyword, token.value, token)


def _indent(text: str) -> int:
    """The column where the code on a line starts."""
    return len(text) - len(text.lstrip()) + 1


def _block_name(head: Token | None) -> str:
    return f"the {head.value} block" if head is not None and head.value != RECOVERED else "the block"


def _missing_braces_message(blocks: list[tuple[Token, Token | None]], where: str) -> str:
    """``missing '}' before line 6 to close the pool block opened at line 3`` (innermost first)."""
    named = [f"{_block_name(head)} opened at line {brace.line}" for brace, head in reversed(blocks)]
    count = "'}'" if len(blocks) == 1 else f"{len(blocks)} '}}'"
    return f"missing {count} {where} to close " + " and ".join(named)


def _missing_braces_hint(blocks: list[tuple[Token, Token | None]], recovered: frozenset[int]) -> str:
    if len(blocks) == 1:
        brace = blocks[0][0]
        where = f"on line {brace.line}" if brace.line in recovered else f"at {brace.line}:{brace.column}"
        return f"add '}}' to close the block that starts {where}"
    return "add one '}' for each block"


def _found(token: Token) -> str:
    if token.type == "$END":
        return "the end of the file"
    if token.type == "_SEP":
        return "the end of the line" if token.value != ";" else "';'"
    return f"'{token.value}'"


def _span(token: Token) -> Span:
    return Span(
        line=token.line,
        col=token.column,
        end_line=token.end_line or token.line,
        end_col=token.end_column or token.column + 1,
    )


def _end_of_text(lines: list[str]) -> Span:
    return Span.point(len(lines), len(lines[-1]) + 1)
