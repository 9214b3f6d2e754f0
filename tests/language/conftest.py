"""Hypothesis profiles for the language tests.

``ci`` (the default) is reproducible: derandomized, no example database, no
deadline (the machine is shared). ``dev`` explores new random examples on each
run and keeps failures in the local database. Pick one with HYPOTHESIS_PROFILE;
scale the number of examples with KVPOLICY_FUZZ_SCALE (e.g. 10 for a long local run).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """``n`` examples, times KVPOLICY_FUZZ_SCALE."""
    return max(1, int(n * float(os.environ.get("KVPOLICY_FUZZ_SCALE", "1"))))
