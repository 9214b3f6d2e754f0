from collections.abc import Iterator

from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity
from kvpolicy.units import MiB, format_bytes

CHUNK_GRANULE = 2 * MiB
"""CUDA's mapping granularity for device memory: every chunk is a multiple of it."""


@register
class InvalidChunk(Rule):
    """A `chunk` that is not a positive multiple of 2 MiB.

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
    """

    code = "KV015"
    name = "invalid-chunk"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for block in (*ctx.policy.defaults, *ctx.policy.gpus):
            chunk = block.chunk
            if chunk is None or chunk.bytes < 0:
                continue
            if chunk.bytes == 0 or chunk.bytes % CHUNK_GRANULE:
                up = max(CHUNK_GRANULE, -(-chunk.bytes // CHUNK_GRANULE) * CHUNK_GRANULE)
                yield self.at(
                    ctx.file, chunk.span, f"chunk {chunk.text} is not a positive multiple of 2 MiB",
                    f"did you mean `chunk {format_bytes(up)}`?",
                )
