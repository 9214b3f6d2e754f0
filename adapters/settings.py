"""Every ``KVPOLICY_*`` variable the engine adapters read, each parsed here once, with one validation.

| variable | read by | value | default |
|---|---|---|---|
| ``KVPOLICY_ENABLE`` | both | ``1``/``true``/``yes`` or ``0``/``false``/``no`` | off |
| ``KVPOLICY_POLICY`` | both | the policy file | none |
| ``KVPOLICY_MODEL`` | both | the policy's name for the engine's model | the served model name |
| ``KVPOLICY_LEDGER_DIR`` | both | the ledger directory | ``/dev/shm/kvpolicy`` |
| ``KVPOLICY_ENGINE_ID`` | both | what every rank of one engine shares in the ledger | per adapter |
| ``KVPOLICY_REPORT_INTERVAL`` | vLLM | seconds between live pool reports, ≥ 0 | 1 |
| ``KVPOLICY_ELASTIC_GIVE_BACK_INTERVAL`` | vLLM | seconds between give-backs of memory above the target, ≥ 0 | 1 |
| ``KVPOLICY_ELASTIC_YIELD_ABOVE_TARGET`` | vLLM | seconds new requests take memory only up to the target after another instance was refused, ≥ 0 | 0 (off) |
| ``KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS`` | both | chunks one give-back of an elastic pool unmaps at most (in whole chunk groups, at least one; the rest at the next steps), a whole number ≥ 0; ``0``: no bound | 128 |
| ``KVPOLICY_ELASTIC_GROW_BYTES`` | vLLM | bytes one growth of the elastic KV cache maps at least, a whole number ≥ 0 | 16 MiB |
| ``KVPOLICY_FIGURES_WAIT`` | vLLM | seconds a rank that cannot measure its device waits at start-up for a controller's figures, ≥ 0 | 60 |

Activation is explicit: nothing happens unless ``KVPOLICY_ENABLE=1``. An empty
variable is an unset one. A value that does not parse is an ``AdapterError`` naming
the variable and what it expects. The engines' entry points read ``AdapterEnv`` in
every process, enabled or not, so this module imports only the standard library.
(The controller's ledger options, ``KVPOLICY_LEDGER_GROUP`` and
``KVPOLICY_LEDGER_ALLOW_FOREIGN_OWNER``, belong to the ledger client,
``kvpolicy.runtime.client``.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.adapters.errors import AdapterError

ENV_ENABLE = "KVPOLICY_ENABLE"
ENV_POLICY = "KVPOLICY_POLICY"
ENV_MODEL = "KVPOLICY_MODEL"
ENV_LEDGER_DIR = "KVPOLICY_LEDGER_DIR"
ENV_ENGINE_ID = "KVPOLICY_ENGINE_ID"
ENV_REPORT_INTERVAL = "KVPOLICY_REPORT_INTERVAL"
ENV_GIVE_BACK_INTERVAL = "KVPOLICY_ELASTIC_GIVE_BACK_INTERVAL"
ENV_YIELD_ABOVE_TARGET = "KVPOLICY_ELASTIC_YIELD_ABOVE_TARGET"
ENV_GROW_BYTES = "KVPOLICY_ELASTIC_GROW_BYTES"
ENV_GIVE_BACK_CHUNKS = "KVPOLICY_ELASTIC_GIVE_BACK_CHUNKS"
ENV_FIGURES_WAIT = "KVPOLICY_FIGURES_WAIT"

DEFAULT_LEDGER_DIR = Path("/dev/shm/kvpolicy")
"""The ledger's own default (``kvpolicy.runtime.client``), written out here: a disabled plugin imports
this module alone, not the ledger (a test keeps the two equal)."""
DEFAULT_REPORT_INTERVAL = 1.0
DEFAULT_GIVE_BACK_INTERVAL = 1.0
DEFAULT_YIELD_ABOVE_TARGET = 0.0
DEFAULT_GROW_BYTES = 16 << 20  # 16 MiB: ledger admissions per batch of blocks, not per block
DEFAULT_FIGURES_WAIT = 60.0  # a controller started beside the engine publishes within a few ticks
# 128 unmaps held one of vLLM's steps 4.7 ms on the H200 (4 GiB at once: 69 ms); README, "Benchmarks"
DEFAULT_GIVE_BACK_CHUNKS = 128

_ON = ("1", "true", "yes")
_OFF = ("0", "false", "no")


@dataclass(frozen=True)
class AdapterEnv:
    """What both adapters read from the environment of the engine process."""

    enabled: bool
    policy: Path | None
    model: str | None
    ledger_dir: Path
    engine_id: str | None = None
    """``KVPOLICY_ENGINE_ID``; None: the adapter's default (see each adapter)."""
    give_back_chunks: int | None = DEFAULT_GIVE_BACK_CHUNKS
    """Chunks one give-back of an elastic pool (above the target, under pressure) unmaps at most, the
    rest at the next steps, so no step of the engine waits for a whole large give-back (None: no
    bound). A lowered limit is applied whole."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AdapterEnv:
        env = os.environ if environ is None else environ
        policy = _text(env, ENV_POLICY)
        enabled = _flag(env, ENV_ENABLE)
        return cls(
            enabled=enabled,
            policy=Path(policy) if policy else None,
            model=_text(env, ENV_MODEL),
            ledger_dir=Path(_text(env, ENV_LEDGER_DIR) or DEFAULT_LEDGER_DIR),
            engine_id=_text(env, ENV_ENGINE_ID),
            # Parsed only once enabled: an engine without kvpolicy never fails on a kvpolicy setting.
            give_back_chunks=(_bound(env, ENV_GIVE_BACK_CHUNKS, DEFAULT_GIVE_BACK_CHUNKS) if enabled
                              else DEFAULT_GIVE_BACK_CHUNKS),
        )


@dataclass(frozen=True)
class VllmEnv:
    """What the vLLM adapter alone reads from the environment (read only once it is enabled)."""

    report_interval: float = DEFAULT_REPORT_INTERVAL
    """Seconds between live pool reports (the engine core's split, and the elastic pool's bytes in use)."""
    give_back_interval: float = DEFAULT_GIVE_BACK_INTERVAL
    """Seconds between give-backs of elastic memory above the target."""
    yield_above_target: float = DEFAULT_YIELD_ABOVE_TARGET
    """Seconds after a step that saw the GPU's budget refuse another instance during which the
    scheduler's new requests take the elastic cache only up to its target (0: off)."""
    grow_bytes: int = DEFAULT_GROW_BYTES
    """Bytes one growth of the elastic KV cache maps at least, while the limit allows."""
    figures_wait: float = DEFAULT_FIGURES_WAIT
    """Seconds a rank that cannot measure its device (a CPU engine without the policy's ``capacity``)
    waits at start-up for a controller to publish the device's figures."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> VllmEnv:
        env = os.environ if environ is None else environ
        return cls(
            report_interval=_seconds(env, ENV_REPORT_INTERVAL, DEFAULT_REPORT_INTERVAL),
            give_back_interval=_seconds(env, ENV_GIVE_BACK_INTERVAL, DEFAULT_GIVE_BACK_INTERVAL),
            yield_above_target=_seconds(env, ENV_YIELD_ABOVE_TARGET, DEFAULT_YIELD_ABOVE_TARGET),
            grow_bytes=_bytes(env, ENV_GROW_BYTES, DEFAULT_GROW_BYTES),
            figures_wait=_seconds(env, ENV_FIGURES_WAIT, DEFAULT_FIGURES_WAIT),
        )


def _text(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


def _flag(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text and text not in _ON + _OFF:
        raise AdapterError(f"kvpolicy: {name}={env[name]!r}: expected 1 or 0")
    return text in _ON


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise AdapterError(f"kvpolicy: {name}={env[name]!r}: expected seconds >= 0, e.g. 1 or 0.5")
    return value


def _bytes(env: Mapping[str, str], name: str, default: int) -> int:
    value = _whole_number(env, name, f"a whole number of bytes >= 0, e.g. {default}")
    return default if value is None else value


def _bound(env: Mapping[str, str], name: str, default: int) -> int | None:
    """A whole number >= 1, or 0 for no bound (None); unset: ``default``."""
    value = _whole_number(env, name, f"a whole number, e.g. {default} (0: no bound)")
    if value is None:
        return default
    return value or None


def _whole_number(env: Mapping[str, str], name: str, expected: str) -> int | None:
    """The setting as a whole number >= 0 written in ASCII digits (no sign, unit or exponent); None if unset."""
    text = env.get(name, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise AdapterError(f"kvpolicy: {name}={env[name]!r}: expected {expected}")
    return int(text)
