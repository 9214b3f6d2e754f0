"""What both engine adapters share: activation from the environment and loud failures.

Activation is explicit (DESIGN §7): nothing happens unless ``KVPOLICY_ENABLE=1``.
Once enabled, anything the adapter cannot do — an engine version it was not
validated against, a hook target that is missing, an admission the ledger refuses —
is an ``AdapterError`` raised at engine start, never a silent no-op.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_ENABLE = "KVPOLICY_ENABLE"
ENV_POLICY = "KVPOLICY_POLICY"
ENV_MODEL = "KVPOLICY_MODEL"
ENV_LEDGER_DIR = "KVPOLICY_LEDGER_DIR"
ENV_ENGINE_ID = "KVPOLICY_ENGINE_ID"
"""What the ranks of one engine share in the ledger (tensor parallel); each adapter has a default."""
DEFAULT_LEDGER_DIR = Path("/dev/shm/kvpolicy")


class AdapterError(RuntimeError):
    """A start-up failure of an enabled adapter; the message says what and how to fix it."""


@dataclass(frozen=True)
class AdapterEnv:
    """The adapter's settings, read from the environment of the engine process."""

    enabled: bool
    policy: Path | None
    model: str | None
    ledger_dir: Path

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AdapterEnv:
        env = os.environ if environ is None else environ
        flag = env.get(ENV_ENABLE, "").strip().lower()
        if flag not in ("", "0", "1", "true", "false", "yes", "no"):
            raise AdapterError(f"{ENV_ENABLE}={env[ENV_ENABLE]!r}: expected 1 or 0")
        policy = env.get(ENV_POLICY)
        return cls(
            enabled=flag in ("1", "true", "yes"),
            policy=Path(policy) if policy else None,
            model=env.get(ENV_MODEL) or None,
            ledger_dir=Path(env.get(ENV_LEDGER_DIR) or DEFAULT_LEDGER_DIR),
        )


def check_version(engine: str, found: str, validated: tuple[str, ...]) -> None:
    """Refuse an engine version the adapter was not validated against."""
    if found not in validated:
        raise AdapterError(
            f"kvpolicy: {engine} {found} is not a validated version for the kvpolicy adapter "
            f"(validated: {', '.join(validated)}). Install a validated version, or unset "
            f"{ENV_ENABLE} to run {engine} without kvpolicy."
        )


def require_attr(owner: object, name: str, hook: str) -> object:
    """The attribute ``owner.name`` that the hook ``hook`` patches, or a loud error."""
    try:
        return getattr(owner, name)
    except AttributeError:
        where = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
        raise AdapterError(
            f"kvpolicy: cannot install the {hook} hook: {where}.{name} does not exist in this "
            f"engine version. The adapter refuses to start rather than run unbudgeted."
        ) from None


def read_policy(path: Path):
    """The policy an enabled adapter runs under; AdapterError naming file:line:col if it cannot be used."""
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.lint.load import load_policy

    try:
        return load_policy(path)
    except PolicyError as exc:
        errors = "\n".join(d.render() for d in exc.errors)
        raise AdapterError(
            f"kvpolicy: the policy {path} has errors, and the engine will not start unbudgeted:\n{errors}"
        ) from None
    except OSError as exc:
        raise AdapterError(f"kvpolicy: cannot read the policy {path} ({ENV_POLICY}): {exc.strerror}") from None
