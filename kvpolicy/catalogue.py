"""The rule catalogue: every diagnostic kvpolicy can emit (the base layer).

Each rule has a stable code (``KV001``), a kebab-case name, a severity, the phase
that reports it, whether ``# kvpolicy: ignore[CODE] reason`` may silence it, and
its documentation: a one-sentence summary, then the sections *What it does*, *Why
is this bad?*, *Example* and *Use instead*, from which ``docs/lint-rules.md`` is
generated (``python -m kvpolicy.lint.docs``).

Who reports a rule is its phase: ``parse`` rules while the text is parsed and built
into a Policy (``kvpolicy.policy``: an unknown unit leaves no value to check later),
``check`` rules on the built Policy (one module per rule in ``kvpolicy/lint/rules/``),
``suppression`` rules on the suppression comments (``kvpolicy.lint.suppress``). The
catalogue is below all of them, so each stamps its diagnostics through ``Rule.at``
without importing the others. Codes are never reused: a rule that goes keeps its
code retired.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from kvpolicy.diagnostics import Diagnostic, DocumentedCode, Severity, Span

Phase = Literal["parse", "check", "suppression"]
PARSE: Phase = "parse"
CHECK: Phase = "check"
SUPPRESSION: Phase = "suppression"

DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead")
_CODE = re.compile(r"KV\d{3}")
_NAME = re.compile(r"[a-z]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Rule(DocumentedCode):
    """One diagnostic kvpolicy can emit: its identity and its documentation."""

    code: str
    name: str
    severity: Severity
    phase: Phase
    suppressible: bool
    doc: str
    """The summary sentence, a blank line, then ``## What it does`` ... ``## Use instead``."""

    def __post_init__(self) -> None:
        if not _CODE.fullmatch(self.code):
            raise ValueError(f"rule code {self.code!r} is not KVnnn")
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"rule name {self.name!r} is not kebab-case")
        if self.phase not in (PARSE, CHECK, SUPPRESSION):
            raise ValueError(f"{self.code}: unknown phase {self.phase!r}")

    def at(self, file: str, span: Span, message: str, hint: str | None = None) -> Diagnostic:
        """A diagnostic of this rule at ``span`` of ``file``."""
        return Diagnostic(
            file=file,
            line=span.line,
            col=span.col,
            end_line=span.end_line,
            end_col=span.end_col,
            code=self.code,
            name=self.name,
            severity=self.severity,
            message=message,
            hint=hint,
        )


def index(rules: Iterable[Rule]) -> dict[str, Rule]:
    """``rules`` by code; a code or a name used twice is refused."""
    by_code: dict[str, Rule] = {}
    names: set[str] = set()
    for rule in rules:
        if rule.code in by_code or rule.name in names:
            raise ValueError(f"{rule.code} {rule.name}: the code or the name is already taken")
        by_code[rule.code] = rule
        names.add(rule.name)
    return by_code


def all_rules() -> tuple[Rule, ...]:
    """Every rule, by code."""
    return RULES


def rule_by_code(code: str) -> Rule | None:
    return _BY_CODE.get(code)


_DEFINED: list[Rule] = []


def _define(code: str, name: str, severity: Severity, phase: Phase, *, suppressible: bool, doc: str) -> Rule:
    rule = Rule(code, name, severity, phase, suppressible, inspect.cleandoc(doc))
    _DEFINED.append(rule)
    return rule


# ---- the rules, by code ---------------------------------------------------------------------


UNKNOWN_UNIT = _define(
    "KV001", "unknown-unit", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    A size or duration has a unit kvpolicy does not know.

    ## What it does
    Checks the unit after every number: sizes take `B KiB MiB GiB TiB` (binary)
    or `KB MB GB TB` (decimal), durations take `ms s m h`, and `%` is a share of
    the GPU's capacity. Suggests the closest known unit.

    ## Why is this bad?
    A size whose unit is unknown has no value; guessing one could hand out a
    thousand times more memory than meant.

    ## Example
    ```
    model "qwen3-8b" { reserve 40 GiBB }
    ```

    ## Use instead
    ```
    model "qwen3-8b" { reserve 40 GiB }
    ```
    """,
)


SYNTAX_ERROR = _define(
    "KV002", "syntax-error", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    The text does not follow the grammar of the kvpolicy language.

    ## What it does
    Reports text the parser cannot read: a missing value, brace or parenthesis, a
    stray character, two statements on one line without `;`. The diagnostic sits
    where the text goes wrong (for a missing value: right after the keyword that
    needs it) and names what was expected in the language's own words.

    ## Why is this bad?
    A policy that cannot be parsed cannot be used: `kvpolicy run` keeps the last
    good policy and reports this error until the file is fixed.

    ## Example
    ```
    model "qwen3-8b" {
      priority
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      priority 10
    }
    ```
    """,
)


MISSING_VERSION = _define(
    "KV003", "missing-version", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    The policy does not start with `version 1`, or names a version this kvpolicy cannot read.

    ## What it does
    Requires a `version` statement with a version this kvpolicy reads (1).

    ## Why is this bad?
    An empty or truncated file has no `version` line: requiring it means such a
    file is an error and can never replace a running policy during a hot reload.
    A future version may mean different things by the same words.

    ## Example
    ```
    model "qwen3-8b" { priority 10 }
    ```

    ## Use instead
    ```
    version 1
    model "qwen3-8b" { priority 10 }
    ```
    """,
)


UNKNOWN_FIELD = _define(
    "KV004", "unknown-field", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    A statement or setting that the language does not have, in this place.

    ## What it does
    Reports a keyword the block does not accept (`priorty` in a `model` block,
    `owner` in a `rule`), with the closest keyword that fits. A top-level keyword
    such as `model` inside a block usually means a `}` is missing above it.

    ## Why is this bad?
    An unknown setting does nothing; a typo would silently leave the default in
    force (priority 0 instead of 100).

    ## Example
    ```
    model "qwen3-8b" {
      priorty 10
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      priority 10
    }
    ```
    """,
)


INVALID_DURATION = _define(
    "KV005", "invalid-duration", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    A duration without a time unit, with a size unit, or below zero.

    ## What it does
    Checks `grace`, `cooldown` and durations compared with `model.idle`: each
    needs a unit among `ms s m h` and must not be negative.

    ## Why is this bad?
    `grace 30` could mean 30 seconds or 30 minutes; kvpolicy does not guess.

    ## Example
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      shrink to min
      grace 30
    }
    ```

    ## Use instead
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      shrink to min
      grace 30s
    }
    ```
    """,
)


NEGATIVE_SIZE = _define(
    "KV006", "negative-size", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A size or percentage below zero.

    ## What it does
    Reports `reserve`, `min`, `max`, `headroom`, `capacity`, `chunk`, `shrink to`
    and compared sizes that are negative.

    ## Why is this bad?
    Memory cannot be negative; a negative headroom would hand out memory the GPU
    does not have.

    ## Example
    ```
    gpu * { headroom -2 GiB }
    ```

    ## Use instead
    ```
    gpu * { headroom 2 GiB }
    ```
    """,
)


INVALID_VALUE = _define(
    "KV007", "invalid-value", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    A value of the wrong kind for its setting or comparison.

    ## What it does
    Reports a size where a whole number belongs (`priority 10 GiB`), a number
    without a unit where a size belongs (`reserve 40`), an `owner` other than
    `runtime` or `elastic`, an `order` direction other than `asc` or `desc`, a
    `shrink to` other than `min`, `target`, a size or a percentage, and a
    comparison whose sides cannot be compared (`gpu.free < 60s`).

    ## Why is this bad?
    The policy would not mean what it says; kvpolicy refuses to guess.

    ## Example
    ```
    model "qwen3-8b" {
      reserve 40
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      reserve 40 GiB
    }
    ```
    """,
)


PERCENT_OVER_100 = _define(
    "KV008", "percent-over-100", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A percentage of the GPU's capacity above 100%.

    ## What it does
    Percentages (`max 40%`, `headroom 5%`, `shrink to 10%`) are shares of the
    GPU's capacity; more than all of it is reported.

    ## Why is this bad?
    No GPU has more than its capacity; a limit above it is a typo (`400%` for `40%`).

    ## Example
    ```
    model "qwen3-*" { max 400% }
    ```

    ## Use instead
    ```
    model "qwen3-*" { max 40% }
    ```
    """,
)


UNKNOWN_ENGINE = _define(
    "KV009", "unknown-engine", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    An `engine` that kvpolicy has no adapter for.

    ## What it does
    `engine` is `sglang`, `vllm`, or `any` (the default: instances of any engine,
    including programs that attach to the ledger themselves).

    ## Why is this bad?
    The engine decides which pool names are valid and which pools can be elastic;
    a misspelt engine would bind no instance the way the policy intends.

    ## Example
    ```
    model "qwen3-8b" { engine vlm }
    ```

    ## Use instead
    ```
    model "qwen3-8b" { engine vllm; reserve 16 GiB }
    ```
    """,
)


UNKNOWN_ATTRIBUTE = _define(
    "KV010", "unknown-attribute", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    An attribute in `when` or `order` that instances and GPUs do not have.

    ## What it does
    `when` compares `gpu.capacity gpu.free gpu.used gpu.reserved` and
    `model.used model.waiting model.idle model.priority model.weight model.min
    model.max model.target model.engine model.name`; `order` takes the short names of the
    `model.*` attributes. Anything else is reported with the closest attribute.

    ## Why is this bad?
    A rule over an attribute that does not exist can never be evaluated.

    ## Example
    ```
    rule "reclaim" {
      when gpu.fre < 8 GiB
      order idle desc
      shrink to min
      grace 30s
    }
    ```

    ## Use instead
    ```
    rule "reclaim" {
      when gpu.free < 8 GiB
      order idle desc
      shrink to min
      grace 30s
    }
    ```
    """,
)


DUPLICATE_DEFINITION = _define(
    "KV011", "duplicate-definition", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    The same model, pool, rule, GPU id or setting defined twice.

    ## What it does
    Reports a second `model` block with the same name, a second `pool` of a name
    in one model, a second `rule` of a name, a GPU id named in two `gpu` blocks
    (or `gpu *` twice), a second `defaults` block, and a setting given twice in
    one block.

    ## Why is this bad?
    Which of the two would win is not obvious to a reader; kvpolicy makes you
    say it once.

    ## Example
    ```
    gpu "cuda:0" { headroom 4 GiB }
    gpu "cuda:0", "cuda:1" { headroom 2 GiB }
    ```

    ## Use instead
    ```
    gpu "cuda:0" { headroom 4 GiB }
    gpu "cuda:1" { headroom 2 GiB }
    ```
    """,
)


UNKNOWN_POOL = _define(
    "KV012", "unknown-pool", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A `pool` name the model's engine does not have.

    ## What it does
    Checks pool names against the pools the engine's adapter reports. SGLang
    (DeepSeek-V4): `swa c4 c128 indexer compressor_state`, the request-to-token
    table `req_to_token` (and `other`). vLLM: the
    same five for DeepSeek-V4, and `full mla sliding_window mamba` for other
    models. A model without `engine` may name any of them.

    ## Why is this bad?
    A budget on a pool that never reports bytes limits nothing.

    ## Example
    ```
    model "deepseek-v4-flash" {
      engine sglang
      pool c5 { owner runtime }
    }
    ```

    ## Use instead
    ```
    model "deepseek-v4-flash" {
      engine sglang
      reserve 40 GiB
      pool c4 { owner runtime }
    }
    ```
    """,
)


UNMANAGEABLE_ELASTIC_POOL = _define(
    "KV013", "unmanageable-elastic-pool", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    `owner elastic` on a pool that the engine's adapter cannot run elastically.

    ## What it does
    A pool is `owner runtime` (the engine allocates it; kvpolicy counts it) or
    `owner elastic` (kvpolicy's allocator backs it and can grow and shrink it).
    Only pools whose adapter supports it can be elastic: on vLLM the standard
    attention caches `full`, `mla` and `sliding_window`; on SGLang (DeepSeek-V4)
    the sliding-window pool `swa`, a plain paged pool read on the decode path only
    through page indices. DeepSeek-V4's other pools stay runtime-owned on both
    engines: `c4` and `c128` are read through the indexer's entries, which alias
    them on the decode hot path; `indexer` is those entries; `compressor_state` is
    ring state rewritten on every step; SGLang's `req_to_token` is a fixed table
    indexed by request slot. Binding them to memory that moves risks corruption.
    On vLLM no DeepSeek-V4 pool can be elastic.

    ## Why is this bad?
    The policy would promise memory the engine will never give back; the
    adapters refuse to start such a model.

    ## Example
    ```
    model "deepseek-v4-flash" {
      engine sglang
      reserve 40 GiB
      pool c4 { owner elastic }
    }
    ```

    ## Use instead
    ```
    model "deepseek-v4-flash" {
      engine sglang
      reserve 40 GiB
      min 2 GiB
      max 12 GiB
      pool swa { owner elastic }
      pool c4 { owner runtime }
    }

    model "qwen3-*" {
      engine vllm
      min 4 GiB
      pool full { owner elastic }
    }
    ```
    """,
)


OUT_OF_RANGE = _define(
    "KV014", "out-of-range", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A priority, weight or size outside its range.

    ## What it does
    `priority` is 0..1000 (higher is more important), `weight` is 1..10000 (a
    share of spare memory), and sizes stay below 8 EiB.

    ## Why is this bad?
    Out-of-range numbers are typos (`priority 10000`), and a weight of 0 would
    starve the model of spare memory in a way nobody reading the file expects.

    ## Example
    ```
    model "qwen3-8b" {
      priority 5000
      weight 0
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      priority 500
      weight 1
    }
    ```
    """,
)


INVALID_CHUNK = _define(
    "KV015", "invalid-chunk", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A `chunk` that is not a positive multiple of 2 MiB.

    ## What it does
    The elastic allocator maps physical memory in chunks; CUDA maps device
    memory in multiples of 2 MiB, so a chunk must be one.

    ## Why is this bad?
    The allocator could not honour the chunk; limits and targets are rounded
    down to the chunk, so a wrong chunk also shifts every published number.

    ## Example
    ```
    defaults { chunk 3 MiB }
    ```

    ## Use instead
    ```
    defaults { chunk 4 MiB }
    ```
    """,
)


MIN_ABOVE_MAX = _define(
    "KV016", "min-above-max", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A model whose `min` is above its `max`.

    ## What it does
    Compares `min` and `max` of each model block: directly when both are sizes or
    both percentages, and on every known GPU capacity (from `gpu ... capacity`,
    `--gpu-capacity` or `--facts`) when one is a size and the other a percentage.

    ## Why is this bad?
    The guarantee could never be honoured within the cap.

    ## Example
    ```
    model "qwen3-8b" {
      min 8 GiB
      max 4 GiB
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      min 4 GiB
      max 8 GiB
    }
    ```
    """,
)


OVER_COMMITMENT = _define(
    "KV017", "over-commitment", Severity.ERROR, CHECK, suppressible=True,
    doc="""
    Guarantees and reservations that do not fit on a GPU.

    ## What it does
    With `--gpu-capacity SIZE` (every GPU has that capacity and hosts one
    instance of each model) or `--facts FILE` (the GPUs and instances in the
    facts), checks on every GPU that Σ min + Σ reserve + headroom ≤ capacity −
    other use. An instance that reports its runtime-owned pools counts their
    bytes instead of its model's `reserve`, as the evaluator does.

    ## Why is this bad?
    Some guarantee would not be honoured (a `shortfall`), or an engine would fail
    its static admission at start.

    ## Example
    ```
    model "a" { reserve 100 GiB }
    model "b" { reserve 60 GiB }
    ```
    checked with `--gpu-capacity 141GiB`.

    ## Use instead
    ```
    model "a" { reserve 80 GiB }
    model "b" { reserve 50 GiB }
    ```
    """,
)


INCOMPLETE_RULE = _define(
    "KV018", "incomplete-rule", Severity.ERROR, CHECK, suppressible=False,
    doc="""
    A `rule` without `when` or without `shrink to`.

    ## What it does
    A rule says when to act (`when`) and what to do (`shrink to`); both are
    required.

    ## Why is this bad?
    A rule without a condition would act on every instance all the time; one
    without an action does nothing.

    ## Example
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      grace 30s
    }
    ```

    ## Use instead
    ```
    rule "idle-reclaim" {
      when model.idle > 60s
      shrink to min
      grace 30s
    }
    ```
    """,
)


DECIMAL_UNIT = _define(
    "KV019", "decimal-unit", Severity.WARNING, CHECK, suppressible=True,
    doc="""
    A size in decimal units (`GB`) where binary units (`GiB`) are almost always meant.

    ## What it does
    Flags `KB MB GB TB` (powers of 1000). GPU memory, chunks and every figure
    kvpolicy prints are in binary units (powers of 1024).

    ## Why is this bad?
    `40 GB` is 37.25 GiB: 7% less than a reader who thinks in GiB expects.

    ## Example
    ```
    model "qwen3-8b" { reserve 40 GB }
    ```

    ## Use instead
    ```
    model "qwen3-8b" { reserve 40 GiB }
    ```
    """,
)


RULE_WITHOUT_GRACE = _define(
    "KV020", "rule-without-grace", Severity.WARNING, CHECK, suppressible=True,
    doc="""
    A `rule` without `grace`: it acts the moment its condition holds.

    ## What it does
    Flags rules that have no `grace` (the time a condition must hold before the
    rule acts).

    ## Why is this bad?
    Without hysteresis a rule flaps: a burst that briefly drops `gpu.free` shrinks
    an instance that needs its memory back a second later.

    ## Example
    ```
    rule "reclaim" {
      when gpu.free < 8 GiB
      shrink to min
    }
    ```

    ## Use instead
    ```
    rule "reclaim" {
      when gpu.free < 8 GiB
      shrink to min
      grace 30s
    }
    ```
    """,
)


UNREACHABLE_MODEL = _define(
    "KV021", "unreachable-model", Severity.WARNING, CHECK, suppressible=True,
    doc="""
    A model glob that can never bind an instance, because another pattern wins for all its names.

    ## What it does
    An instance binds the most specific matching `model` block: an exact name,
    then the longest pattern, then the first in the file. A glob is unreachable
    when another pattern that outranks it matches every name it matches (e.g.
    `"qwen3-*"` after an equally long `"qwen*-*"` that is earlier in the file).

    Whether one glob matches every name of another is hard to decide in general,
    so the work is bounded: at most 20,000 automaton steps for a pair and
    2,000,000 for the whole policy. A pair not decided within its bound is not
    reported, nor are the pairs left once the policy's bound is spent: the rule
    then says less, never something wrong. Real policies stay far below both.

    ## Why is this bad?
    The block's settings never apply, though a reader would expect them to.

    ## Example
    ```
    model "qwen?-*" { priority 10 }
    model "qwen3-*" { priority 20 }
    ```

    ## Use instead
    ```
    model "qwen3-*" { priority 20 }
    model "qwen?-*" { priority 10 }
    ```
    """,
)


INEFFECTIVE_SETTING = _define(
    "KV022", "ineffective-setting", Severity.WARNING, CHECK, suppressible=True,
    doc="""
    A setting that has no effect for this model yet.

    ## What it does
    `min`, `max` and `weight` govern elastic KV memory. They take effect once
    the model marks a pool `owner elastic` (on vLLM e.g. `pool full { owner
    elastic }`, on SGLang DeepSeek-V4 `pool swa { owner elastic }`); without one
    the engine's KV cache is sized from `reserve` alone and the settings do
    nothing. An engine whose adapter runs no elastic pool never has elastic
    memory.

    ## Why is this bad?
    The file reads as if the model had a guarantee it will never get.

    ## Example
    ```
    model "qwen3-8b" {
      engine vllm
      reserve 40 GiB
      min 8 GiB
    }
    ```

    ## Use instead
    ```
    model "qwen3-8b" {
      engine vllm
      min 8 GiB
      pool full { owner elastic }
    }
    ```
    """,
)


SUPPRESSION_WITHOUT_REASON = _define(
    "KV023", "suppression-without-reason", Severity.WARNING, SUPPRESSION, suppressible=False,
    doc="""
    A `# kvpolicy: ignore[...]` comment that does not say why.

    ## What it does
    A suppression silences the named codes on its line (or, alone on a line, on
    the next line). It must give a reason after the closing bracket.

    ## Why is this bad?
    The next person to edit the policy cannot tell a deliberate exception from a
    silenced mistake.

    ## Example
    ```
    model "a" { reserve 40 GB }  # kvpolicy: ignore[KV019]
    ```

    ## Use instead
    ```
    model "a" { reserve 40 GB }  # kvpolicy: ignore[KV019] vendor sizes are decimal
    ```
    """,
)


INVALID_SUPPRESSION = _define(
    "KV024", "invalid-suppression", Severity.WARNING, SUPPRESSION, suppressible=False,
    doc="""
    A suppression that names an unknown code, or a code that cannot be suppressed.

    ## What it does
    Checks the codes in `# kvpolicy: ignore[...]`. Errors that leave the policy
    without a meaning (syntax errors, unknown units, ...) cannot be suppressed;
    warnings and `over-commitment` can.

    ## Why is this bad?
    The comment suppresses nothing, though it reads as if it did.

    ## Example
    ```
    model "a" { reserve 40 GiBB }  # kvpolicy: ignore[KV001] typo
    ```

    ## Use instead
    ```
    model "a" { reserve 40 GiB }
    ```
    """,
)


UNUSED_SUPPRESSION = _define(
    "KV025", "unused-suppression", Severity.WARNING, SUPPRESSION, suppressible=False,
    doc="""
    A suppression whose code is not reported on the line it covers.

    ## What it does
    Reports codes in `# kvpolicy: ignore[...]` that silenced nothing.

    ## Why is this bad?
    Stale suppressions hide the next real finding on that line.

    ## Example
    ```
    model "a" { reserve 40 GiB }  # kvpolicy: ignore[KV019] decimal on purpose
    ```

    ## Use instead
    ```
    model "a" { reserve 40 GiB }
    ```
    """,
)


POLICY_TOO_LARGE = _define(
    "KV026", "policy-too-large", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    A policy file larger than the size limit (1 MiB unless `KVPOLICY_MAX_POLICY_SIZE` says otherwise).

    ## What it does
    Every reader of a policy (`kvpolicy lint`, `fmt`, `explain`, the controller's
    reload, the engine adapters) reads at most the limit and refuses a larger file,
    with this error at the line and column where the limit falls. The limit is
    `KVPOLICY_MAX_POLICY_SIZE`, a size such as `4MiB` or a number of bytes, in the
    environment of the command or of the controller.

    ## Why is this bad?
    A policy is a few kilobytes. Parsing costs some hundred bytes of memory per
    character, so a runaway file (generated in a loop, or `/dev/zero` behind a
    symlink) would exhaust the controller's memory before any check could refuse it.

    ## Example
    ```
    # generated: one block per model of the fleet, and some 40,000 more below
    model "family0-*" { priority 10 }
    model "family1-*" { priority 11 }
    model "family2-*" { priority 12 }
    ```

    ## Use instead
    ```
    model "family*" { priority 10 }
    ```
    """,
)


VALIDATION_BUDGET_EXCEEDED = _define(
    "KV027", "validation-budget-exceeded", Severity.ERROR, PARSE, suppressible=False,
    doc="""
    A policy that could not be checked within the work budget of a hot reload.

    ## What it does
    The controller validates every save of the policy file before it goes live,
    within a budget of work (counted in units of about one character parsed, one
    node checked or one step comparing two globs, so that the verdict does not
    depend on how busy the machine is). A text that needs more is refused with this
    error and the running policy stays. `kvpolicy lint` and the editor's server
    have no budget (each check is bounded on its own: see KV021).

    ## Why is this bad?
    A reload that takes seconds delays every reload after it, and the policy in
    force with them.

    ## Example
    ```
    model "a*" { priority 1 }
    model "b*" { priority 2 }
    model "c*" { priority 3 }
    model "d*" { priority 4 }
    model "e*" { priority 5 }
    ```

    ## Use instead
    ```
    model "*" { priority 1 }
    ```
    """,
)


SGLANG_WITHOUT_RESERVE = _define(
    "KV028", "sglang-without-reserve", Severity.ERROR, CHECK, suppressible=True,
    doc="""
    An SGLang model without `reserve`: the DeepSeek-V4 adapter refuses to start it.

    ## What it does
    Reports a `model` block with `engine sglang` and no `reserve`. SGLang's adapter
    sizes DeepSeek-V4's runtime-owned pools (SWA, C4, C128, indexer, compressor
    state and the request table) from the model's `reserve`, and stops the engine
    at start when the block that binds it has none.

    ## Why is this bad?
    The engine fails to start: "model has no `reserve` ... DeepSeek-V4's pools are
    sized from it". SGLang runs no elastic pool, so nothing else could size them.

    ## Example
    ```
    model "deepseek-v4-flash" {
      engine sglang
      priority 100
    }
    ```

    ## Use instead
    ```
    model "deepseek-v4-flash" {
      engine sglang
      priority 100
      reserve 40 GiB
    }
    ```
    """,
)


VLLM_WITHOUT_RESERVE_OR_ELASTIC_POOL = _define(
    "KV029", "vllm-without-reserve-or-elastic-pool", Severity.ERROR, CHECK, suppressible=True,
    doc="""
    A vLLM model with neither `reserve` nor an `owner elastic` pool: the vLLM adapter refuses to start it.

    ## What it does
    Reports a `model` block with `engine vllm` that has no `reserve` and marks no
    pool `owner elastic`. The vLLM adapter sizes the KV cache one of two ways: a
    static cache of the model's `reserve`, or an elastic pool that kvpolicy's
    allocator grows and shrinks within `min` and `max`. With neither, it stops
    the engine at start.

    ## Why is this bad?
    The engine fails to start: "the policy sets no `reserve` for model ..., so
    vLLM's KV cache cannot be sized from it".

    ## Example
    ```
    model "qwen3-8b" {
      engine vllm
      min 8 GiB
    }
    ```

    ## Use instead
    A static cache, or an elastic pool:
    ```
    model "qwen3-8b" {
      engine vllm
      reserve 16 GiB
    }

    model "qwen3-14b" {
      engine vllm
      min 8 GiB
      pool full { owner elastic }
    }
    ```
    """,
)


SHRINK_ON_LOW_USE = _define(
    "KV030", "shrink-on-low-use", Severity.WARNING, CHECK, suppressible=True,
    doc="""
    A `rule` that shrinks an instance while its use is low, and says nothing of work waiting for memory.

    ## What it does
    Flags a rule whose `when` holds when `model.used` is below a figure (a
    comparison `model.used < X` or `model.used <= X` that the whole condition
    needs) and that mentions neither `model.waiting` nor `model.idle`.

    ## Why is this bad?
    A shrink holds while its condition holds. A request that needs more than
    the shrink value leaves cannot start, so the instance's use stays low, the
    condition keeps holding and the request waits — until its client gives up.
    On the co-location benchmark's long-prompt trace, tenants shrunk to a 4 GiB
    `min` left prompts of up to 4 GiB of KV waiting until their clients gave up.

    ## Example
    ```
    rule "idle-reclaim" {
      when model.used < 3 GiB
      shrink to min
      grace 3s
    }
    ```

    ## Use instead
    `model.waiting` is the memory the instance's work waits for (0 when nothing
    waits): the shrink ends as soon as a request needs more, and never starts
    while one does.
    ```
    rule "idle-reclaim" {
      when model.used < 3 GiB and model.waiting == 0
      shrink to min
      grace 3s
    }
    ```
    """,
)

RULES: tuple[Rule, ...] = tuple(sorted(_DEFINED, key=lambda rule: rule.code))
_BY_CODE = index(RULES)
