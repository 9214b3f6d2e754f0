"""What a policy is checked against, as ``kvpolicy lint`` and ``explain`` have it.

In order: the client's settings (``kvpolicy.facts``: a facts file;
``kvpolicy.gpuCapacity``: every GPU's capacity), else the sample facts beside the
policy (``NAME.facts.json`` next to ``NAME.kvp``, as ``kvpolicy explain`` finds
them). With neither, a policy whose ``gpu`` blocks give every GPU it names a
``capacity`` is checked against those capacities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpolicy.facts import Facts
from kvpolicy.facts_io import FactsError, read_facts, sample_facts_path
from kvpolicy.paths import reason
from kvpolicy.units import parse_size

SETTINGS_SECTION = "kvpolicy"
SETTING_FACTS = "facts"
SETTING_GPU_CAPACITY = "gpuCapacity"


@dataclass(frozen=True)
class Settings:
    facts: str | None = None
    gpu_capacity: int | None = None
    problems: tuple[str, ...] = ()
    """Settings that could not be used, in words."""

    @classmethod
    def from_values(cls, facts: Any, gpu_capacity: Any) -> Settings:
        problems: list[str] = []
        if facts is not None and not isinstance(facts, str):
            problems.append(f"kvpolicy.facts must be a path, not {facts!r}")
            facts = None
        capacity: int | None = None
        if isinstance(gpu_capacity, bool):
            problems.append(f"kvpolicy.gpuCapacity must be a size such as \"141GiB\", not {gpu_capacity!r}")
        elif isinstance(gpu_capacity, int) and gpu_capacity > 0:
            capacity = gpu_capacity
        elif isinstance(gpu_capacity, str) and gpu_capacity.strip():
            try:
                capacity = parse_size(gpu_capacity)
            except ValueError as exc:
                problems.append(f"kvpolicy.gpuCapacity: {exc}")
        elif gpu_capacity not in (None, ""):
            problems.append(f"kvpolicy.gpuCapacity must be a size such as \"141GiB\", not {gpu_capacity!r}")
        return cls(facts or None, capacity, tuple(problems))

    @classmethod
    def from_object(cls, value: Any) -> Settings:
        """From ``{"facts": ..., "gpuCapacity": ...}`` (initializationOptions, or a whole section)."""
        if not isinstance(value, dict):
            return cls()
        return cls.from_values(value.get(SETTING_FACTS), value.get(SETTING_GPU_CAPACITY))


@dataclass(frozen=True)
class CheckContext:
    facts: Facts | None = None
    facts_path: Path | None = None
    gpu_capacity: int | None = None
    capacity_from: str | None = None
    """Where ``gpu_capacity`` comes from, in words."""


@dataclass
class FactsCache:
    """Facts files by path, read again only when they change on disk."""

    _read: dict[Path, tuple[tuple[int, int], Facts | None, str | None]] = field(default_factory=dict)

    def get(self, path: Path) -> tuple[Facts | None, str | None]:
        """The facts in ``path``, or the reason they cannot be read."""
        try:
            stat = path.stat()
        except OSError as exc:
            return None, f"{path}: {reason(exc)}"
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._read.get(path)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        try:
            facts, problem = read_facts(path), None
        except FactsError as exc:
            facts, problem = None, str(exc)
        self._read[path] = (key, facts, problem)
        return facts, problem


def facts_path_for(policy: Path | None, settings: Settings, root: Path | None) -> Path | None:
    """The facts file for ``policy``: the setting's (relative to the workspace root, else to
    the policy's folder), else the sample facts beside the policy if there are some."""
    if settings.facts:
        path = Path(settings.facts).expanduser()
        if not path.is_absolute():
            base = root or (policy.parent if policy else Path.cwd())
            path = base / path
        return path
    if policy is not None:
        sample = sample_facts_path(policy)
        if sample.is_file():
            return sample
    return None
