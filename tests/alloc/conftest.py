from __future__ import annotations

from collections.abc import Iterator

import pytest
from alloc_support import DRIVER_KINDS, make_driver, resources

from kvpolicy.alloc import Driver


@pytest.fixture(params=DRIVER_KINDS)
def driver(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """A host driver (fresh, 4 GiB) or the GPU's driver; fails the test if it leaves anything behind."""
    d = make_driver(request.param)
    before = resources(d)
    yield d
    d.clear_faults()
    leaked = resources(d)
    if d.kind == "host":
        d.close()
    assert leaked == before, f"driver resources (handles, mapped, reserved) went from {before} to {leaked}"
