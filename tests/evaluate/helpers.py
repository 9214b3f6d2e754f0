"""Small builders for evaluator tests: policies from text, facts from a few words."""

from __future__ import annotations

import textwrap

from kvpolicy.evaluate.decide import evaluate
from kvpolicy.evaluate.decision import Decision, State
from kvpolicy.facts import Facts
from kvpolicy.lint.load import policy_from_text
from kvpolicy.policy import Policy
from kvpolicy.units import GiB, MiB

__all__ = ["GiB", "MiB", "gpu", "inst", "make_facts", "make_policy", "run"]


def make_policy(body: str) -> Policy:
    return policy_from_text("version 1\n" + textwrap.dedent(body).lstrip("\n"), "test.kvp")


def gpu(id: str = "cuda:0", capacity: int = 80 * GiB, other_used: int = 0) -> dict:
    return {"id": id, "capacity": capacity, "other_used": other_used}


def inst(
    id: str,
    model: str | None = None,
    gpu: str = "cuda:0",
    used: int | None = 0,
    idle: float = 0.0,
    pools: dict[str, int] | None = None,
    engine: str = "any",
    engine_id: str | None = None,
    waiting: int = 0,
) -> dict:
    """An instance; elastic with ``used`` bytes (and ``waiting`` refused to it) unless ``used`` is None."""
    data: dict = {
        "id": id,
        "model": model or id.split("/")[0],
        "engine": engine,
        "gpu": gpu,
        "idle_seconds": idle,
        "pools": {name: {"owner": "runtime", "bytes": size} for name, size in (pools or {}).items()},
    }
    if used is not None:
        data["elastic"] = {"used": used, "mapped": used, "waiting": waiting}
    if engine_id is not None:
        data["engine_id"] = engine_id
    return data


def make_facts(gpus: list[dict], instances: list[dict], now: float = 1000.0) -> Facts:
    return Facts.model_validate({"schema": 1, "now": now, "gpus": gpus, "instances": instances})


def run(policy: Policy, facts: Facts, state: State | None = None) -> tuple[Decision, State]:
    return evaluate(policy, facts, state)
