"""KV015 invalid-chunk: a `chunk` that is not a positive multiple of 2 MiB.

The check; the rule and its documentation are in ``kvpolicy.catalogue``.
"""

from collections.abc import Iterator

from kvpolicy import catalogue
from kvpolicy.diagnostics import Diagnostic
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Check, register
from kvpolicy.policy.model import Defaults, GpuBlock
from kvpolicy.units import MiB, format_bytes

CHUNK_GRANULE = 2 * MiB
"""CUDA's mapping granularity for device memory: every chunk is a multiple of it."""


@register
class InvalidChunk(Check):
    rule = catalogue.INVALID_CHUNK

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        blocks: tuple[Defaults | GpuBlock, ...] = (*ctx.policy.defaults, *ctx.policy.gpus)
        for block in blocks:
            chunk = block.chunk
            if chunk is None or chunk.bytes < 0:
                continue
            if chunk.bytes == 0 or chunk.bytes % CHUNK_GRANULE:
                up = max(CHUNK_GRANULE, -(-chunk.bytes // CHUNK_GRANULE) * CHUNK_GRANULE)
                yield self.at(
                    ctx.file, chunk.span, f"chunk {chunk.text} is not a positive multiple of 2 MiB",
                    f"did you mean `chunk {format_bytes(up)}`?",
                )
