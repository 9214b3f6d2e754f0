"""Waiting for something another thread or process does, with a bound only to catch a hang."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 120.0) -> T:
    """``predicate()`` once it is truthy, polling every 5 ms; its last value after ``timeout``.

    A wait that succeeds returns at once, so the bound costs a passing test nothing: keep it
    long enough for a machine at a load average of 20.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    return predicate()
