"""Syntax errors in the user's words.

The parser knows which token it did not expect and which it would have taken;
this module turns that into a message about the policy ("'priority' needs a
number"), never about the grammar (no terminal names), placed where the fix
goes (a missing value: right after the keyword that needs it), and a hint.
``ERROR_EXAMPLES`` pairs each kind of error with inputs that produce it; the
tests check every example yields its kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from functools import cache

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from kvpolicy.catalogue import SYNTAX_ERROR, UNKNOWN_FIELD, UNKNOWN_UNIT
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.policy.build import BLOCK_FIELDS, unknown_keyword
from kvpolicy.policy.syntax import RECOVERED, NestingTooDeep, Trace, parser
from kvpolicy.policy.vocabulary import UNIT_ALIASES

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

# Kinds of syntax error, each with inputs that produce it (checked by the tests).
ERROR_EXAMPLES: dict[str, tuple[str, ...]] = {
    "missing-value": ('version 1\nmodel "a" {\n  priority\n}\n', "version 1\ngpu * { headroom }\n"),
    "missing-operand": ('version 1\nrule "r" {\n  when gpu.free <\n}\n',),
    "missing-open-brace": ('version 1\nmodel "a"\n  priority 1\n',),
    "unquoted-name": ("version 1\nmodel qwen {\n}\n", "version 1\nrule idle { }\n"),
    "missing-selector": ("version 1\ngpu { headroom 1 GiB }\n",),
    "quoted-word": ('version 1\nmodel "a" { engine "vllm" }\n',),
    "missing-close-brace": (
        'version 1\nmodel "a" {\n  priority 1\n',
        'version 1\nmodel "a" {\n  priority 1\nmodel "b" {}\n',
        'version 1\nmodel "a" {\n  priority 1\nrule "r" {\n  when gpu.free < 1 GiB\n}\n',
        'version 1\nmodel "a" {\n  pool swa {\n    owner runtime\n\n  priority 1\n}\n',
    ),
    "missing-close-paren": ('version 1\nrule "r" {\n  when (gpu.free < 8 GiB\n  shrink to min\n}\n',),
    "unmatched-close-brace": ("version 1\n}\n",),
    "unmatched-close-paren": ('version 1\nrule "r" { when gpu.free < 8 GiB) }\n',),
    "two-statements": ('version 1\nmodel "a" { priority 1 weight 2 }\n', "version 1\nrule \"r\" { when gpu.free < 8 GiB gpu.used }\n"),
    "missing-to": ('version 1\nrule "r" { shrink min }\n',),
    "bad-character": ('version 1\nmodel "a" { reserve 40 @ }\n',),
    "unterminated-string": ('version 1\nmodel "a\n',),
    "too-deep": ('version 1\nrule "r" { when ' + "not " * 40 + "gpu.free < 1 GiB }\n", "version 1\nrule \"r\" { when " + "(" * 40 + "gpu.free < 1 GiB" + ")" * 40 + " }\n",),
    "wrong-value": ('version 1\nmodel "a" { engine 5 }\n', 'version 1\nrule "r" { order , }\n'),
    "keyword-as-unit": ('version 1\nrule "r" { grace 5 min }\n',),
    "chained-comparison": ('version 1\nrule "r" { when 1 GiB < gpu.free < 8 GiB }\n',),
    "misplaced-statement": (
        'version 1\nmodel "a" { when gpu.free < 8 GiB }\n',
        'version 1\nrule "r" {\n  whn gpu.free < 8 GiB\n}\n',
    ),
    "unexpected": ('version 1\nrule "r" { when gpu.free 5 }\n',),
}

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
    kind: str
    diagnostic: Diagnostic
    recover_line: int | None
    """The line to replace before parsing again; None: stop reporting."""
    replacement: str | None = None
    """What replaces that line; None: a placeholder that keeps its braces balanced."""
    also: tuple[Diagnostic, ...] = ()
    """More errors found at once (e.g. several blocks left open at the end)."""


def explain_failure(exc: Exception, session: Trace, lines: list[str], file: str) -> Failure:
    if isinstance(exc, UnexpectedCharacters):
        return _bad_character(exc, file)
    if isinstance(exc, NestingTooDeep):
        span = _span(exc.token)
        return Failure("too-deep", SYNTAX_ERROR.at(file, span, exc.what, "flatten the structure"), None)
    assert isinstance(exc, UnexpectedToken)
    return _Explainer(exc, session, lines, file).explain()


class _Explainer:
    def __init__(self, exc: UnexpectedToken, session: Trace, lines: list[str], file: str) -> None:
        self.token: Token = _as_keyword(exc.token)
        self.expected: set[str] = set(exc.accepts or exc.expected)
        self.session = session
        self.lines = lines
        self.file = file
        self.at_end = self.token.type == "$END"
        self.history = session.history
        self.previous: Token | None = self.history[-1] if self.history else None
        if self.previous is not None and self.previous.type == "_SEP":
            # the postlexer merges a run of separators into one, so after one the user
            # may always write another: the grammar has no need to say so
            self.expected.add("_SEP")

    def fail(
        self,
        kind: str,
        span: Span,
        message: str,
        hint: str | None = None,
        recover: int | bool = True,
        replacement: str | None = None,
        rule=SYNTAX_ERROR,
    ) -> Failure:
        """The failure ``kind``, reported under ``rule`` (a few errors have a rule of their own)."""
        line = (None if self.at_end else self.token.line) if recover is True else (recover or None)
        return Failure(kind, rule.at(self.file, span, message, hint), line, replacement)

    def explain(self) -> Failure:
        token, expected, previous = self.token, self.expected, self.previous
        prev_word = previous.value if previous is not None else ""
        example = EXAMPLES.get(prev_word)
        eg = f"e.g. `{example}`" if example else None

        if self.session.open_parens and "RPAR" in expected and not expected & _VALUE_TYPES:
            paren = self.session.open_parens[-1]
            return self.fail(
                "missing-close-paren", self._after(previous) if previous else _span(token),
                f"missing ')' to close the '(' at {paren.line}:{paren.column}",
                "close every '(' with ')'", recover=paren.line,
            )
        forgotten = self._forgotten_close_brace()
        if forgotten is not None:
            return forgotten
        if self.at_end and "RBRACE" in expected and self.session.open_braces:
            return self._missing_brace()
        misplaced = self._misplaced_statement()
        if misplaced is not None:
            return misplaced
        if token.type in _STATEMENT_END and expected & _VALUE_TYPES and not expected & {"_SEP", "RBRACE"}:
            if previous is not None and previous.type == "COMPARE":
                return self.fail("missing-operand", self._after(previous), f"missing a value after '{prev_word}'", "e.g. `gpu.free < 8 GiB`")
            if previous is not None and previous.type != "_SEP":
                return self.fail("missing-value", self._after(previous), f"{self._setting(prev_word)} needs {self._words(expected)}", eg)
        if expected == {"STRING", "STAR"}:
            return self.fail(
                "missing-selector", _span(token), f"'gpu' needs a selector, found {_found(token)}",
                'use `gpu * { ... }` for every GPU, or `gpu "cuda:0", "cuda:1" { ... }`',
            )
        if previous is not None and prev_word in EXAMPLES and expected <= _VALUE_TYPES and token.type not in _STATEMENT_END:
            if not (expected == {"STRING"} and token.type == "NAME") and not (expected == {"NAME"} and token.type == "STRING"):
                return self.fail("wrong-value", _span(token), f"{self._setting(prev_word)} needs {self._words(expected)}, found {_found(token)}", eg)
        if expected == {"STRING"} and token.type == "NAME":
            return self._unquoted_name()
        if "LBRACE" in expected and not expected & (_VALUE_TYPES - {"STRING"}):
            return self._missing_open_brace()
        if expected == {"NAME"} and token.type == "STRING":
            bare = token.value.strip('"')
            return self.fail(
                "quoted-word", _span(token), f"'{prev_word}' takes a bare name, not a quoted string",
                f"write `{prev_word} {bare}`" if _WORD.fullmatch(bare) else eg,
            )
        if token.type == "RPAR" and not self.session.open_parens:
            return self.fail("unmatched-close-paren", _span(token), "unmatched ')'", "remove it, or add the '(' it closes")
        if token.type == "RBRACE" and not self.session.open_braces:
            return self.fail("unmatched-close-brace", _span(token), "unmatched '}'", "remove it, or look above for a '}' too many")
        if prev_word == "shrink" and "TO" in expected:
            return self.fail("missing-to", _span(token), f"expected 'to' after 'shrink', found {_found(token)}", "e.g. `shrink to min`")
        if token.type == "COMPARE" and "_SEP" in expected and self._head_type() == "WHEN":
            return self.fail(
                "chained-comparison", _span(token), f"comparisons cannot be chained: unexpected '{token.value}'",
                "join two comparisons with 'and', e.g. `gpu.free > 1 GiB and gpu.free < 8 GiB`",
            )
        if (
            previous is not None and previous.type == "QUANTITY" and previous.value[-1:].isdigit()
            and token.value in UNIT_ALIASES and token.line == previous.line
        ):
            # `grace 5 min`: a keyword is never read as a unit, so this is not one quantity
            span = _span(token)
            return self.fail(
                "keyword-as-unit", span, f"unknown unit '{token.value}'",
                f"did you mean '{UNIT_ALIASES[token.value]}'? (`{previous.value}{UNIT_ALIASES[token.value]}`)",
                rule=UNKNOWN_UNIT,
            )
        if "_SEP" in expected and token.type not in _STATEMENT_END and previous is not None:
            return self.fail(
                "two-statements", _span(token),
                f"expected the end of the statement after '{prev_word}', found {_found(token)}",
                "put one statement per line, or separate statements with ';'",
            )
        return self.fail(
            "unexpected", _span(token) if not self.at_end else _end_of_text(self.lines),
            f"unexpected {_found(token)}; expected {self._words(expected)}",
            "e.g. `gpu.free < 8 GiB`" if "COMPARE" in expected else None,
        )

    def _unquoted_name(self) -> Failure:
        """``model qwen3-8b {``: the name as written (up to the '{'), and a recovery
        that quotes it, so the block's body is still read and checked."""
        token, keyword = self.token, self.previous.value if self.previous else ""
        line = self.lines[token.line - 1]
        start = token.column - 1
        word = re.match(r"[^\s{]+", line[start:]).group()
        rest = line[start + len(word) :]
        # Quoting shifts what follows by two columns: only when nothing else can be reported there.
        replacement = line[:start] + f'"{word}"' + rest if rest.strip() in ("{", "{}") else None
        span = Span(line=token.line, col=token.column, end_line=token.line, end_col=token.column + len(word))
        return self.fail(
            "unquoted-name", span, f'names are quoted strings: write "{word}"',
            f'e.g. `{keyword} "{word}" {{ ... }}`', replacement=replacement,
        )

    def _missing_open_brace(self) -> Failure:
        token, previous = self.token, self.previous
        head = self._statement_head()
        keyword = head.value if head is not None and head.type != "NAME" else None
        # by identity: tokens compare equal by their text, and an earlier 'model' is not this one
        start = next((i for i in range(len(self.history) - 1, -1, -1) if self.history[i] is head), None)
        header = " ".join(t.value for t in self.history[start:] if t.type != "_SEP") if start is not None else ""
        rest = "\n".join(self.lines[token.line :]) if not self.at_end else ""
        # A block body follows (its '}' is below): parse it as a block, so its
        # lines are not reported again as statements out of place.
        body_follows = token.type == "_SEP" and rest.count("}") > rest.count("{")
        return self.fail(
            "missing-open-brace",
            self._after(previous) if previous is not None and token.type in _STATEMENT_END else _span(token),
            f"expected '{{' to open the {keyword} block, found {_found(token)}" if keyword
            else f"expected '{{', found {_found(token)}",
            'separate GPU ids with commas: `gpu "cuda:0", "cuda:1" { ... }`' if keyword == "gpu" and token.type == "STRING"
            else f"e.g. `{header} {{`" if header else None,
            replacement=f"{RECOVERED} {{" if body_follows else "",
        )

    def _forgotten_close_brace(self) -> Failure | None:
        """A ``model``/``rule``/``gpu``/``defaults`` block inside a block, indented no
        deeper than the enclosing statements: their '}' was forgotten above it.

        Recovery closes them at the end of the last line of code before it, so the
        statements below are read (and checked) where they belong.
        """
        for head, around in self.session.nested_heads:
            unclosed = [(brace, outer) for brace, outer in around if (outer or brace).column >= head.column]
            if not unclosed:
                continue  # indented deeper: nested on purpose; the builder says it cannot be there
            where = head.line
            # Indentation may place the forgotten '}' higher up (a pool's, closing its
            # model too early): trust it when it accounts for as many blocks.
            found = [
                (brace, outer, line) for brace, outer, line in self._unclosed_by_indentation()
                if brace.start_pos < head.start_pos and line is not None and line <= head.line
            ]
            if len(found) == len(unclosed):
                where = min(line for _, _, line in found)
                unclosed = [(brace, outer) for brace, outer, line in found if line == where]
            last = self._last_code_line(unclosed[-1][0].line, where)
            return self.fail(
                "missing-close-brace", Span.point(where, _indent(self.lines[where - 1])),
                _missing_braces_message(unclosed, f"before line {where}"), _missing_braces_hint(unclosed, self.session.recovered_lines),
                recover=last, replacement=self._code(last) + " }" * len(unclosed),
            )
        return None

    def _last_code_line(self, first: int, before: int) -> int:
        """The last line from ``first`` up to (not including) ``before`` that has code."""
        for number in range(before - 1, first - 1, -1):
            if self._code(number).strip():
                return number
        return first

    def _code(self, number: int) -> str:
        """Line ``number`` without its comment."""
        text = self.lines[number - 1]
        for comment in self.session.comments:
            if comment.line == number:
                return text[: comment.column - 1].rstrip()
        return text.rstrip()

    def _missing_brace(self) -> Failure:
        """The end of the file with blocks still open: say where each '}' is missing.

        Indentation tells where a block was meant to end (the first later line
        indented no deeper than its statement); where that reading accounts for
        every open block, each gets its own error. Otherwise the innermost open block
        gets one.
        """
        open_now = self.session.open_braces
        found = self._unclosed_by_indentation()
        if len(found) != len(open_now):
            brace, head = open_now[-1]
            found = [(brace, head, self._first_line_at_or_left_of((head or brace).column, brace.line))]
        by_place: dict[int | None, list[tuple[Token, Token | None]]] = {}
        for brace, head, line in found:
            by_place.setdefault(line, []).append((brace, head))
        diagnostics = []
        for line, blocks in sorted(by_place.items(), key=lambda item: item[0] or len(self.lines) + 1):
            blocks.sort(key=lambda block: block[0].start_pos)
            if line is None:
                span, where = _end_of_text(self.lines), "at the end of the file"
            else:
                span, where = Span.point(line, _indent(self.lines[line - 1])), f"before line {line}"
            diagnostics.append(SYNTAX_ERROR.at(self.file, span, _missing_braces_message(blocks, where), _missing_braces_hint(blocks, self.session.recovered_lines)))
        return Failure("missing-close-brace", diagnostics[0], None, also=tuple(diagnostics[1:]))

    def _unclosed_by_indentation(self) -> list[tuple[Token, Token | None, int | None]]:
        """Blocks whose '}' is not where their indentation says it should be:
        (its '{', its statement, the line the '}' belongs before; None: the end)."""
        found = []
        for brace, head in self.session.blocks:
            close = self.session.closed_by.get(brace.start_pos)
            if close is not None and close.line == brace.line:
                continue  # a block on one line
            indent = (head or brace).column
            line = self._first_line_at_or_left_of(indent, brace.line)
            closes_there = line is not None and self.lines[line - 1].lstrip().startswith("}") and _indent(self.lines[line - 1]) == indent
            if close is None:
                if not closes_there:
                    found.append((brace, head, line))
            elif line is not None and close.line >= line and not closes_there:
                found.append((brace, head, line))
        return found

    def _first_line_at_or_left_of(self, column: int, after: int) -> int | None:
        """The first line after ``after`` with code that starts at or left of ``column``."""
        for number in range(after + 1, len(self.lines) + 1):
            text = self.lines[number - 1]
            stripped = text.lstrip()
            if not stripped or stripped.startswith("#"):
                continue
            if _indent(text) <= column:
                return number
        return None

    def _misplaced_statement(self) -> Failure | None:
        """An error inside a statement whose first word the block does not take:
        that word is the mistake (a typo, or a setting of another block)."""
        head = self._statement_head()
        if head is None or head.type != "NAME" or head.value == RECOVERED or head is self.token:
            return None
        block_head = self.session.open_braces[-1][1] if self.session.open_braces else None
        if block_head is not None and (block_head.type == "NAME" or block_head.value not in BLOCK_FIELDS):
            return None  # inside an unknown block: that block's keyword is reported
        message, hint = unknown_keyword(head.value, block_head.value if block_head is not None else None)
        return self.fail("misplaced-statement", _span(head), message, hint, rule=UNKNOWN_FIELD)

    def _head_type(self) -> str | None:
        head = self._statement_head()
        return head.type if head is not None else None

    def _statement_head(self) -> Token | None:
        """The first token of the statement being parsed (``model``, ``rule``...)."""
        head = None
        for token in reversed(self.history):
            if token.type == "_SEP" or token.value in ("{", "}"):
                break
            head = token
        return head

    def _after(self, token: Token) -> Span:
        """The point just after ``token``: where a missing value belongs."""
        return Span.point(token.end_line or token.line, token.end_column or token.column + len(token.value))

    def _setting(self, word: str) -> str:
        """How a message names the statement that needs a value."""
        return "'shrink to'" if word == "to" else f"'{word}'"

    def _words(self, types: set[str]) -> str:
        if self.previous is not None and self.previous.type == "TO":
            return "min, target, a size or a percentage"
        if types == {"NAME", "ATTRIBUTE"}:  # only `order` takes both, and only to refuse the attribute
            return "an attribute's short name such as `priority` or `idle`"
        if "ATTRIBUTE" in types and "COMPARE" not in types:
            return "a condition such as `gpu.free < 8 GiB`"
        if types == {"QUANTITY"} and self.previous is not None and self.previous.value in _VALUE_WORDS:
            return _VALUE_WORDS[self.previous.value]
        terminals = {t.name: t.pattern.value for t in parser().terminals}
        keywords = sorted(terminals[t] for t in types if t in terminals and _WORD.fullmatch(str(terminals[t])))
        words: list[str] = []
        if len(keywords) > 3:
            words.append("a setting such as " + ", ".join(f"'{k}'" for k in keywords[:3]))
        else:
            words.extend(f"'{k}'" for k in keywords)
        for t in sorted(types):
            if t in _TOKEN_WORDS and not (t == "NAME" and len(keywords) > 3):
                words.append(_TOKEN_WORDS[t])
            elif t in terminals and not _WORD.fullmatch(str(terminals[t])):
                words.append(f"'{terminals[t]}'")
        if not words:
            return "something else"
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


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
}


def _bad_character(exc: UnexpectedCharacters, file: str) -> Failure:
    span = Span.point(exc.line, exc.column)
    if exc.char == '"':
        diagnostic = SYNTAX_ERROR.at(file, span, "unterminated string", 'close the string with " on the same line')
        return Failure("unterminated-string", diagnostic, exc.line)
    if not exc.char.isprintable() or exc.char.isspace():
        shown = f"U+{ord(exc.char):04X}"
    else:
        shown = f'"{exc.char}"' if exc.char == "'" else f"'{exc.char}'"
    hint = _BAD_CHARACTER_HINTS.get(exc.char)
    return Failure("bad-character", SYNTAX_ERROR.at(file, span, f"unexpected character {shown}", hint), exc.line)
