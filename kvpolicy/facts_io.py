"""Reading facts JSON (files, standard input, test fixtures) with errors people can act on.

A ``kvpolicy status --format json`` document (or the controller's ``status.json``) is read
as facts too: its GPUs with the figures the controller published, its instances as the
ledger reported them, ``now`` the time it was written. So a change can be previewed
against a node's state saved earlier, or copied from another machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeGuard

from kvpolicy.document_codes import MISSING_FIELD, WRONG_TYPE
from kvpolicy.facts import Facts
from kvpolicy.json_text import FACTS, CarriesProblems, DocumentInvalid, DocumentProblem, load_document, read_document_text
from kvpolicy.paths import FACTS_SUFFIX, POLICY_SUFFIX, reason


def sample_facts_path(policy: Path) -> Path:
    """Where the sample facts of the policy file ``policy`` are, whether or not there are any."""
    return policy.with_name(policy.name.removesuffix(POLICY_SUFFIX) + FACTS_SUFFIX)


class FactsError(CarriesProblems, Exception):
    """Facts that cannot be used: the message names the file and the field; ``problems`` those of the
    document (``kvpolicy.document_codes``)."""

    def __init__(self, message: str, problems: DocumentInvalid | None = None) -> None:
        super().__init__(message)
        self.problems = problems

    @classmethod
    def of(cls, exc: DocumentInvalid) -> FactsError:
        return cls(str(exc), exc)


class FactsUnreadable(FactsError):
    """The facts file cannot be read at all (missing, a directory, no permission): a usage error; ``why`` says
    which, in the system's words."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: cannot read it: {why}")
        self.why = why


def parse_facts(text: str, source: str = "<facts>") -> Facts:
    """``text`` as facts (or a status document's facts); ``FactsError`` with its problems in ``source``."""
    def as_facts(data: object) -> object:
        return facts_from_status(data) if is_status_document(data) else data

    try:
        return load_document(Facts, text, source, kind=FACTS, convert=as_facts, locate=_in_status)
    except DocumentInvalid as exc:
        raise FactsError.of(exc) from None


def _in_status(path: tuple[str, ...]) -> tuple[str, ...]:
    """Where the value of the facts at ``path`` came from in the status document they were made of."""
    return ("written_at",) if path == ("now",) else path


STATUS_ONLY_KEYS = frozenset({"written_at", "controller", "last_reload", "problems"})
"""Top-level keys of a status document that facts never have."""
INSTANCE_FACT_KEYS = ("id", "model", "engine", "engine_id", "gpu", "rank", "pid", "pools", "elastic", "idle_seconds")


def is_status_document(data: object) -> TypeGuard[dict]:
    return isinstance(data, dict) and bool(STATUS_ONLY_KEYS & data.keys())


def facts_from_status(data: dict) -> dict:
    """The facts a status document describes (plain data, validated as facts by the caller).

    A GPU without published figures (no controller gave them) cannot be decided for: it is
    an error naming it, as the budgets would be unknown. ``DocumentProblem`` at the entry at fault.
    """
    gpus = []
    for index, gpu in enumerate(data.get("gpus") or []):
        if not isinstance(gpu, dict):
            raise DocumentProblem(WRONG_TYPE, ("gpus", index), f"gpus.{index}: a GPU entry must be an object ({{...}})")
        if gpu.get("capacity") is None:
            raise DocumentProblem(
                MISSING_FIELD, ("gpus", index, "capacity") if "capacity" in gpu else ("gpus", index),
                f"gpus.{index}.capacity: GPU {gpu.get('id')!r} has no capacity in this status (no controller published "
                "its figures)", "run the controller with a source of GPU figures, or write facts by hand")
        gpus.append({"id": gpu.get("id"), "capacity": gpu["capacity"], "other_used": gpu.get("other_used") or 0})
    instances = []
    for index, inst in enumerate(data.get("instances") or []):
        if not isinstance(inst, dict):
            raise DocumentProblem(WRONG_TYPE, ("instances", index),
                                  f"instances.{index}: an instance entry must be an object ({{...}})")
        facts = {k: inst[k] for k in INSTANCE_FACT_KEYS if inst.get(k) is not None}
        facts["pools"] = {n: {"owner": p.get("owner", "runtime"), "bytes": p.get("bytes")}
                          for n, p in (inst.get("pools") or {}).items() if isinstance(p, dict)}
        instances.append(facts)
    return {"schema": 1, "now": data.get("written_at") or 0.0, "gpus": gpus, "instances": instances}


def read_facts(path: Path | str) -> Facts:
    """The facts file ``path``; ``FactsUnreadable`` if it cannot be read, ``FactsError`` with its problems."""
    path = Path(path)
    try:
        text = read_document_text(path)
    except OSError as exc:
        raise FactsUnreadable(path, reason(exc)) from None
    except DocumentInvalid as exc:
        raise FactsError.of(exc) from None
    return parse_facts(text, str(path))
