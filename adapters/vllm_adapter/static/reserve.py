"""The one place the vLLM adapter reads the policy: this model's ``reserve``."""

from __future__ import annotations

from pathlib import Path

from kvpolicy.adapters.common import read_policy
from kvpolicy.adapters.errors import AdapterError
from kvpolicy.adapters.settings import ENV_ENABLE, ENV_POLICY


def policy_reserve(policy: Path | None, model: str) -> int:
    """Bytes the policy reserves per GPU for ``model``'s KV cache; a loud error if none.

    The ``reserve`` of ``kvpolicy.policy.resolve.model_settings`` for the policy at ``policy``.
    """
    from kvpolicy.policy.resolve import model_settings

    if policy is None:
        raise AdapterError(
            f"kvpolicy: {ENV_ENABLE}=1 but {ENV_POLICY} is not set: the vLLM adapter sizes the KV "
            f"cache from the policy's `reserve`. Set {ENV_POLICY}=/path/to/policy.kvp."
        )
    reserve = model_settings(read_policy(policy), model).reserve
    if not reserve:
        raise AdapterError(
            f"kvpolicy: the policy {policy} sets no `reserve` for model {model!r}, so vLLM's KV cache "
            "cannot be sized from it. Add `reserve SIZE` to the model block that binds it "
            f"(or set KVPOLICY_MODEL to the policy's model name), or unset {ENV_ENABLE}."
        )
    return int(reserve)


def reserve_where(policy: Path | None, model: str) -> str | None:
    """Where the policy sets ``model``'s ``reserve`` (``file:line``), for a refusal's message; None
    if it sets none or cannot be read (the refusal then says what it can without it)."""
    from kvpolicy.policy.resolve import model_settings

    if policy is None:
        return None
    try:
        block = model_settings(read_policy(policy), model).block
    except AdapterError:
        return None
    if block is None or block.reserve is None:
        return None
    return f"{policy}:{block.reserve.span.line}"
