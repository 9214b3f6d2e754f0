"""A per-input hang catcher for in-process fuzzing: SIGALRM interrupts Python code that runs too long."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Hang(Exception):
    """An input ran past the hang bound."""


@contextmanager
def hang_guard(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("the hang guard needs the main thread (SIGALRM)")

    def expired(signum, frame):
        raise Hang(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
