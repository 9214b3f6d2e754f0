"""KV003 missing-version: the policy does not start with `version 1`, or names a version this kvpolicy cannot read.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic, Span
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register

SUPPORTED_VERSION = 1


@register
class MissingVersion(Check):
    rule = catalogue.MISSING_VERSION

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        version = ctx.policy.version
        if version is None and ctx.policy.has_version_statement:
            return  # there is one: building it reported what is wrong with its number
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
