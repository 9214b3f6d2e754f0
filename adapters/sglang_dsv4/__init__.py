"""The SGLang DeepSeek-V4 adapter: per-pool reservation facts and policy-sized pools.

The V4 pools (SWA, C4, C128, indexer, compressor state) are owned by SGLang: the
adapter observes and sizes them. A policy that marks ``pool swa { owner elastic }``
puts the SWA pool on the elastic allocator (``elastic``; tensor parallel 1 only):
its tensors are views over reserved address space, mapped as SGLang's SWA
allocator hands out pages, under the engine's elastic limit in the ledger.

Activation reaches every SGLang process through SGLang's own general-plugin
entry point (group ``sglang.srt.plugins``, name ``kvpolicy``): SGLang 0.5.23
calls ``load_plugins()`` in the launcher, the scheduler subprocesses (one per
TP rank), the detokenizer and the DP controller. ``plugin`` does nothing unless
``KVPOLICY_ENABLE=1``. SGLang logs and swallows ``Exception`` from plugins, so a
refusal is raised as ``StartupRefused`` (a ``SystemExit``): the process stops
with the message instead of running unbudgeted.

Module map: ``geometry``/``plan``/``footprint``/``elastic_policy`` are pure
(``kvpolicy plan`` uses them without torch or sglang); ``facts`` reads a live pool;
``hooks`` patches SGLang; ``ports`` holds the policy/ledger protocols; ``elastic``
puts the SWA pool on the allocator (``elastic_wiring`` builds it at start-up).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..common import check_version
from ..errors import AdapterError
from ..settings import AdapterEnv

if TYPE_CHECKING:
    from .ports import Connector, ReserveSource

VALIDATED_VERSIONS = ("0.5.23",)

logger = logging.getLogger("kvpolicy.adapters.sglang_dsv4")


class StartupRefused(SystemExit):
    """An enabled adapter refused to start; passes through SGLang's ``except Exception``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def plugin() -> None:
    """SGLang general-plugin entry point: activate the adapter in this process if enabled."""
    try:
        env = AdapterEnv.from_environ()
        if not env.enabled:
            return
        activate(env)
    except AdapterError as exc:
        logger.critical("%s", exc)
        raise StartupRefused(str(exc)) from exc


def installed_sglang_version() -> str:
    """The version of the importable sglang package."""
    try:
        from sglang.version import __version__
    except ImportError as exc:
        raise AdapterError(f"kvpolicy: KVPOLICY_ENABLE=1 but sglang cannot be imported here: {exc}") from None
    return str(__version__)


def activate(
    env: AdapterEnv, reserve_source: ReserveSource | None = None, connect: Connector | None = None,
    version: str | None = None,
) -> list[str]:
    """Check the SGLang version and install the hooks; returns the hook targets installed.

    ``reserve_source`` and ``connect`` default to the policy named by ``KVPOLICY_POLICY``
    and the ledger under ``KVPOLICY_LEDGER_DIR``; both are reached at pool-sizing time.
    """
    from . import hooks
    from .ports import default_connector, policy_reserve, require_policy_file

    found = installed_sglang_version() if version is None else version
    check_version("SGLang", found, VALIDATED_VERSIONS)
    if reserve_source is None:
        require_policy_file(env)  # fail now, in the launcher, rather than after loading weights
        reserve_source = lambda model: policy_reserve(env)(model)  # noqa: E731 (re-read at start-up)
    if connect is None:
        connect = lambda identity, **options: default_connector(env)(identity, **options)  # noqa: E731 - the connector is made when an engine connects
    state = hooks.AdapterState(reserve_source=reserve_source, connect=connect, model_name=env.model,
                               give_back_chunks=env.give_back_chunks)
    targets = hooks.install(state)
    logger.warning(
        "kvpolicy: SGLang %s DeepSeek-V4 adapter active (policy %s, model %s, ledger %s); hooks: %s",
        found, env.policy, env.model or "<served model name>", env.ledger_dir, ", ".join(targets),
    )
    return targets
