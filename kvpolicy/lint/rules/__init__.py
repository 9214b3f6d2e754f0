"""Every check, one module each; importing this package registers them all."""

from kvpolicy.lint.registry import CHECKS, Check
from kvpolicy.lint.rules import (  # noqa: F401  (each registers its check)
    decimal_unit,
    duplicate_definition,
    incomplete_rule,
    ineffective_setting,
    invalid_chunk,
    min_above_max,
    missing_version,
    negative_size,
    out_of_range,
    over_commitment,
    percent_over_100,
    rule_without_grace,
    sglang_without_reserve,
    shrink_on_low_use,
    unknown_engine,
    unknown_pool,
    unmanageable_elastic_pool,
    unreachable_model,
    vllm_without_reserve_or_elastic_pool,
)

def all_checks() -> list[type[Check]]:
    """Every check, by its rule's code."""
    return [CHECKS[code] for code in sorted(CHECKS)]
