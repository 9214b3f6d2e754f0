"""A plan's refusal against vLLM's: the same check refuses, quoting the same figures.

vLLM refuses a budget in one of two ways: no block fits ("No available memory for the cache
blocks"), or one request at max_model_len does not ("... (X GiB KV cache is needed, which is larger
than the available KV cache memory (Y GiB) ... the estimated maximum model length is Z"). The plan
says the same in its own words, with vLLM's X, Y and Z.
"""

from __future__ import annotations

import re

GIB = re.compile(r"\(?(\d+(?:\.\d+)?) GiB")
ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")


def assert_same_refusal(ours: str, theirs: str) -> str:
    """Assert that the plan's message ``ours`` refuses for vLLM's reason ``theirs``; return which reason."""
    if "No available memory" in theirs:
        assert "no available memory" in ours, (ours, theirs)
        return "no block fits"
    theirs_gib, ours_gib = GIB.findall(theirs), GIB.findall(ours)
    assert theirs_gib and ours_gib[:2] == theirs_gib[:2], (ours, theirs)
    assert ESTIMATE.findall(ours) == ESTIMATE.findall(theirs), (ours, theirs)
    return "one request does not fit"
