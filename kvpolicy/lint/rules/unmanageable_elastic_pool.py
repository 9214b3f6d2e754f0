from collections.abc import Iterator

from kvpolicy.engines import DEEPSEEK_V4_POOLS, elastic_pools, pool_vocabulary
from kvpolicy.lint.context import LintContext
from kvpolicy.lint.registry import Rule, register
from kvpolicy.diagnostics import Diagnostic, Severity


@register
class UnmanageableElasticPool(Rule):
    """`owner elastic` on a pool that the engine's adapter cannot run elastically.

    ## What it does
    A pool is `owner runtime` (the engine allocates it; kvpolicy counts it) or
    `owner elastic` (kvpolicy's allocator backs it and can grow and shrink it).
    Only pools whose adapter supports it can be elastic: on vLLM the standard
    attention caches `full`, `mla` and `sliding_window`; no DeepSeek-V4 pool, on
    either engine (its indexer aliases compressed entries on the decode hot path,
    so binding them to memory that moves risks corruption).

    ## Why is this bad?
    The policy would promise memory the engine will never give back; the vLLM
    adapter refuses to start such a model.

    ## Example
    ```
    model "deepseek-v4-flash" {
      engine vllm
      pool swa { owner elastic }
    }
    ```

    ## Use instead
    ```
    model "deepseek-v4-flash" {
      engine vllm
      reserve 40 GiB
      pool swa { owner runtime }
    }

    model "qwen3-*" {
      engine vllm
      min 4 GiB
      pool full { owner elastic }
    }
    ```
    """

    code = "KV013"
    name = "unmanageable-elastic-pool"
    severity = Severity.ERROR
    suppressible = False

    def check(self, ctx: LintContext) -> Iterator[Diagnostic]:
        for model in ctx.policy.models:
            engine = model.engine.value if model.engine else None
            elastic = elastic_pools(engine)
            for pool in model.pools:
                name = pool.name.value
                if pool.owner is None or pool.owner.value != "elastic" or name in elastic:
                    continue
                if name not in pool_vocabulary(engine):
                    continue  # unknown-pool says it
                who = f"the {engine} adapter" if engine else "no adapter"
                hint = (
                    "elastic pools: " + ", ".join(sorted(elastic))
                    if elastic
                    else "use `owner runtime`: no pool of this engine can be elastic yet"
                )
                if elastic and name in DEEPSEEK_V4_POOLS:
                    hint = f"use `owner runtime`: DeepSeek-V4's pools stay runtime-owned ({hint})"
                yield self.at(ctx.file, pool.owner.span, f"{who} cannot run pool '{name}' elastically", hint)
