"""Reading facts JSON (files, standard input, test fixtures) with errors people can act on.

A ``kvpolicy status --format json`` document (or the controller's ``status.json``) is read
as facts too: its GPUs with the figures the controller published, its instances as the
ledger reported them, ``now`` the time it was written. So a change can be previewed
against a node's state saved earlier, or copied from another machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeGuard

from kvpolicy.facts import Facts
from kvpolicy.json_text import DocumentInvalid, load_document
from kvpolicy.paths import FACTS_SUFFIX, POLICY_SUFFIX, InputTooLarge, read_input, reason


def sample_facts_path(policy: Path) -> Path:
    """Where the sample facts of the policy file ``policy`` are, whether or not there are any."""
    return policy.with_name(policy.name.removesuffix(POLICY_SUFFIX) + FACTS_SUFFIX)


class FactsError(Exception):
    """Facts that cannot be used: the message names the file and the field."""


class FactsUnreadable(FactsError):
    """The facts file cannot be read at all (missing, a directory, no permission): a usage error."""


def parse_facts(text: str, source: str = "<facts>") -> Facts:
    def as_facts(data: object) -> object:
        return facts_from_status(data, source) if is_status_document(data) else data

    try:
        return load_document(Facts, text, source, expected="valid facts", what="facts", convert=as_facts)
    except DocumentInvalid as exc:
        raise FactsError(str(exc)) from None


STATUS_ONLY_KEYS = frozenset({"written_at", "controller", "last_reload", "problems"})
"""Top-level keys of a status document that facts never have."""
INSTANCE_FACT_KEYS = ("id", "model", "engine", "engine_id", "gpu", "rank", "pid", "pools", "elastic", "idle_seconds")


def is_status_document(data: object) -> TypeGuard[dict]:
    return isinstance(data, dict) and bool(STATUS_ONLY_KEYS & data.keys())


def facts_from_status(data: dict, source: str) -> dict:
    """The facts a status document describes (plain data, validated as facts by the caller).

    A GPU without published figures (no controller gave them) cannot be decided for: it is
    an error naming it, as the budgets would be unknown.
    """
    gpus = []
    for gpu in data.get("gpus") or []:
        if not isinstance(gpu, dict):
            raise FactsError(f"{source}: not a valid status document: a GPU entry is not an object")
        if gpu.get("capacity") is None:
            raise FactsError(
                f"{source}: GPU {gpu.get('id')!r} has no capacity in this status (no controller published its "
                "figures): run the controller with a source of GPU figures, or write facts by hand"
            )
        gpus.append({"id": gpu.get("id"), "capacity": gpu["capacity"], "other_used": gpu.get("other_used") or 0})
    instances = []
    for inst in data.get("instances") or []:
        if not isinstance(inst, dict):
            raise FactsError(f"{source}: not a valid status document: an instance entry is not an object")
        facts = {k: inst[k] for k in INSTANCE_FACT_KEYS if inst.get(k) is not None}
        facts["pools"] = {n: {"owner": p.get("owner", "runtime"), "bytes": p.get("bytes")}
                          for n, p in (inst.get("pools") or {}).items() if isinstance(p, dict)}
        instances.append(facts)
    return {"schema": 1, "now": data.get("written_at") or 0.0, "gpus": gpus, "instances": instances}


def read_facts(path: Path | str) -> Facts:
    path = Path(path)
    try:
        data = read_input(path)
    except OSError as exc:
        raise FactsUnreadable(f"{path}: cannot read it: {reason(exc)}") from None
    except InputTooLarge as exc:
        raise FactsError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FactsError(f"{path}: not valid UTF-8 (byte {exc.start}: {data[exc.start]:#04x}); facts are UTF-8 JSON") from None
    return parse_facts(text, str(path))
