"""Colour on a terminal: when to use it, and the styles every command paints with.

``--color auto`` (the default) colours a stream only when it is a terminal, and
never when ``NO_COLOR`` is set to anything but the empty string
(https://no-color.org). ``FORCE_COLOR`` (any non-empty value) colours under
``auto`` even when the stream is not a terminal, for CI logs that render ANSI;
``NO_COLOR`` wins over it. ``--color always`` and ``--color never`` override both
variables, as a flag given for one run should. ``TERM=dumb`` is a terminal without
colour.

Styles are named by what they mean (``error``, ``hint``, a memory segment), not by
their colour, so that every command paints the same thing the same way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Literal

ColorMode = Literal["auto", "always", "never"]
COLOR_MODES: tuple[ColorMode, ...] = ("auto", "always", "never")

# SGR parameters per meaning.
ROLES: Mapping[str, str] = {
    "error": "1;31",  # bold red
    "warning": "1;33",  # bold yellow
    "code": "1",  # a diagnostic's code
    "location": "1",  # file:line:col
    "hint": "36",  # cyan
    "caret": "1;31",
    "caret_warning": "1;33",
    "problem": "1;31",
    "ok": "32",
    "dim": "2",
    "heading": "1",
    # Memory segments of a GPU bar (kvpolicy.gpu_bar).
    "headroom": "2",
    "other": "35",  # magenta
    "used": "32",  # green
    "free": "2",
    "guaranteed": "34",
}
POOL_ROLES = ("33", "36", "34", "35", "31", "93", "96", "94", "95", "91")
"""Colours of runtime-owned pools in a bar, in turn (the nth pool of a bar takes the nth)."""

_SGR = re.compile(r"\x1b\[[0-9;]*m")


def color_enabled(mode: ColorMode, stream: IO[str] | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether to colour what goes to ``stream`` under ``--color mode``."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    if env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


@dataclass(frozen=True)
class Style:
    """Paints text with a role's colour, or leaves it alone when colour is off."""

    enabled: bool = False

    @classmethod
    def for_stream(cls, stream: IO[str] | None, mode: ColorMode = "auto") -> Style:
        return cls(color_enabled(mode, stream))

    def paint(self, text: str, role: str) -> str:
        if not self.enabled or not text:
            return text
        return f"\x1b[{ROLES[role]}m{text}\x1b[0m"

    def pool(self, text: str, index: int) -> str:
        """The ``index``-th runtime-owned pool of a bar."""
        if not self.enabled or not text:
            return text
        return f"\x1b[{POOL_ROLES[index % len(POOL_ROLES)]}m{text}\x1b[0m"


PLAIN = Style(False)


def strip_styles(text: str) -> str:
    """``text`` without colour codes (its width on the screen is ``len`` of this)."""
    return _SGR.sub("", text)


def visible_width(text: str) -> int:
    return len(strip_styles(text))
