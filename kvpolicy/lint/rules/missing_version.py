from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity, Span

SUPPORTED_VERSION = 1


@register
class MissingVersion(Rule):
    """The policy does not start with `version 1`, or names a version this kvpolicy cannot read.

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
    """

    code = "KV003"
    name = "missing-version"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        version = ctx.policy.version
        if version is None:
            yield self.at(
                ctx.file, Span.point(1, 1), "the policy has no 'version' statement",
                "start the file with `version 1`",
            )
        elif version.value != SUPPORTED_VERSION:
            yield self.at(
                ctx.file, version.span,
                f"unsupported version {version.value}: this kvpolicy reads version {SUPPORTED_VERSION}",
                f"write `version {SUPPORTED_VERSION}`, or upgrade kvpolicy",
            )
