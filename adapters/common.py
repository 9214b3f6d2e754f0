"""What both engine adapters check at start: the engine's version, the hook targets, the policy.

Each failure is an ``AdapterError`` (``kvpolicy.adapters.errors``) whose message says
what to fix; the settings themselves come from ``kvpolicy.adapters.settings``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import ENV_ENABLE, ENV_POLICY

if TYPE_CHECKING:
    from kvpolicy.json_text import JsonObjectFile
    from kvpolicy.policy.model import Policy


def check_version(engine: str, found: str, validated: tuple[str, ...]) -> None:
    """Refuse an engine version the adapter was not validated against."""
    if found not in validated:
        raise AdapterError(
            f"kvpolicy: {engine} {found} is not a validated version for the kvpolicy adapter "
            f"(validated: {', '.join(validated)}). Install a validated version, or unset "
            f"{ENV_ENABLE} to run {engine} without kvpolicy."
        )


def require_attr(owner: object, name: str, hook: str) -> Any:
    """The attribute ``owner.name`` that the hook ``hook`` patches, or a loud error (Any: an
    engine's, and the engines ship no types the check follows)."""
    try:
        return getattr(owner, name)
    except AttributeError:
        where = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
        raise AdapterError(
            f"kvpolicy: cannot install the {hook} hook: {where}.{name} does not exist in this "
            f"engine version. The adapter refuses to start rather than run unbudgeted."
        ) from None


def read_config_json(path: Path) -> JsonObjectFile:
    """A model's ``config.json``: the JSON object it holds, with its text (to place the problems its values
    have). ``OSError`` when the file cannot be read; ``DocumentInvalid`` with the diagnostics of what is wrong
    with it as a JSON object (``kvpolicy.document_codes``: not UTF-8, too large, not JSON, not an object)."""
    from kvpolicy.json_text import read_json_object  # here: a disabled plugin imports only the settings

    return read_json_object(path, what="model config")  # /dev/zero is no config: read to a limit


def read_policy(path: Path) -> Policy:
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
