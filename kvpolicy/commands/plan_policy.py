"""``kvpolicy plan --policy FILE --model NAME``: what a policy hands an engine adapter at start-up.

The engine-neutral half: load the policy, bind the model, take the GPU's settings,
and say which engine plans it (the model block's ``engine``, else ``--engine``).
Each engine's planner then turns the model's settings into the budget its adapter
gives the engine (SGLang: ``budget_for_reserve``; vLLM: ``vllm_startup_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvpolicy.commands.common import UsageError, check_readable
from kvpolicy.engines import ANY_ENGINE
from kvpolicy.paths import reason
from kvpolicy.policy.resolve import DEFAULT_CHUNK, gpu_settings, model_settings
from kvpolicy.units import format_bytes

if TYPE_CHECKING:
    from kvpolicy.policy.model import Policy
    from kvpolicy.policy.resolve import ModelSettings

LISTED_PATTERNS = 8
"""How many of a policy's model blocks an unbound --model lists."""


class PolicyPlanError(Exception):
    """The policy cannot be planned; ``code`` is the exit status (1: the input, 2: the command line)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PolicyTarget:
    """One model of a policy on one GPU: the settings its adapter reads at start-up."""

    path: Path
    model: str
    gpu: str
    settings: ModelSettings
    capacity: int | None
    """The GPU's capacity: the policy's ``capacity`` for it, else ``--gpu-capacity``; None if neither."""
    chunk: int = DEFAULT_CHUNK
    """The GPU's mapping granularity (the policy's ``chunk`` for it)."""

    @property
    def engine(self) -> str | None:
        engine = self.settings.engine
        return None if engine in (None, ANY_ENGINE) else engine

    @property
    def where(self) -> str:
        line = self.settings.line
        return f"{self.path}:{line}" if line else str(self.path)

    def reserve(self) -> int:
        """The model's ``reserve`` in bytes; a model without one cannot be planned (its adapter refuses too)."""
        reserve = self.settings.reserve
        if not reserve:
            raise PolicyPlanError(
                f"{self.path}: model {self.model!r} (the block {self.settings.pattern!r} at {self.where}) has no "
                "`reserve`; the engine adapter sizes the KV cache from it and refuses to start without one: "
                "add e.g. `reserve 40 GiB`"
            )
        return int(reserve)


def load_target(path: str, model: str | None, gpu: str, gpu_capacity: int | None) -> PolicyTarget:
    """The policy's settings for ``model`` on ``gpu``; PolicyPlanError with the file's diagnostics if it has errors."""
    from kvpolicy.diagnostics import PolicyError
    from kvpolicy.lint.load import load_policy

    if not model:
        raise PolicyPlanError("--policy needs --model NAME: the model's name as the policy binds it", code=2)
    file = Path(path)
    try:
        check_readable("plan", file)
    except UsageError as exc:
        raise PolicyPlanError(str(exc), code=2) from None
    try:
        policy = load_policy(file)
    except PolicyError as exc:
        raise PolicyPlanError("\n".join(d.render() for d in exc.errors)) from None
    except OSError as exc:
        raise PolicyPlanError(f"{path}: cannot read it: {reason(exc)}", code=2) from None
    settings = model_settings(policy, model)
    if settings.block is None:
        raise unbound_model(path, policy, model)
    on_gpu = gpu_settings(policy, gpu)
    capacity = on_gpu.capacity if on_gpu.capacity is not None else gpu_capacity
    return PolicyTarget(path=file, model=model, gpu=gpu, settings=settings, capacity=capacity, chunk=on_gpu.chunk)


def unbound_model(path: str, policy: Policy, model: str) -> PolicyPlanError:
    """No block binds ``model``: the name on the command line is at fault (exit 2), so say which names bind."""
    from kvpolicy.suggest import did_you_mean

    patterns = [block.name.value for block in policy.models]
    message = f"{path}: no model block binds --model {model!r}"
    if not patterns:
        return PolicyPlanError(f"{message}: the policy has no model blocks", code=2)
    hint = did_you_mean(model, patterns)
    listed = ", ".join(repr(p) for p in patterns[:LISTED_PATTERNS])
    more = f" and {len(patterns) - LISTED_PATTERNS} more" if len(patterns) > LISTED_PATTERNS else ""
    return PolicyPlanError(f"{message}{'; ' + hint if hint else ''} (its model blocks: {listed}{more})", code=2)


def choose_engine(target: PolicyTarget, engine: str | None) -> str:
    """The engine that plans ``target``: the model block's, or ``--engine``; they must agree."""
    if target.engine is not None and engine is not None and target.engine != engine:
        raise PolicyPlanError(
            f"--engine {engine}, but {target.where} binds {target.model!r} to engine {target.engine}", code=2
        )
    chosen = target.engine or engine
    if chosen is None:
        raise PolicyPlanError(
            f"{target.where}: the model block of {target.model!r} names no engine: give --engine", code=2
        )
    return chosen


@dataclass(frozen=True)
class VllmStartup:
    """What the vLLM adapter sets at start-up: ``kv_cache_memory_bytes``, and the layout if it forces one."""

    budget: int
    kv_cache_layout: str | None
    why: str


def vllm_startup_budget(target: PolicyTarget) -> VllmStartup:
    """The vLLM adapter's sizing (``plugin.size_kv_cache``): an elastic model plans its ``max`` with the
    block-outermost layout; a static one its ``reserve`` in whole allocator granules."""
    from kvpolicy.adapters.errors import AdapterError
    from kvpolicy.adapters.vllm_adapter.elastic.policy import ELASTIC_LAYOUT, elastic_settings
    from kvpolicy.adapters.vllm_adapter.pools import ALLOCATOR_GRANULE

    try:
        elastic = elastic_settings(target.path, target.model, target.gpu, target.capacity)
    except AdapterError as exc:
        raise PolicyPlanError(str(exc)) from None
    if elastic is not None:
        return VllmStartup(
            budget=elastic.virtual,
            kv_cache_layout=ELASTIC_LAYOUT,
            why=f"elastic: vLLM plans the model's max ({format_bytes(elastic.virtual)}) with layout {ELASTIC_LAYOUT}",
        )
    reserve = target.reserve()
    budget = reserve - reserve % ALLOCATOR_GRANULE
    return VllmStartup(
        budget=budget, kv_cache_layout=None, why=f"reserve {format_bytes(reserve)} in whole 2 MiB granules"
    )
