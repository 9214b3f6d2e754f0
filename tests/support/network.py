"""A loopback port for a test's server or process group."""

from __future__ import annotations

import socket


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
