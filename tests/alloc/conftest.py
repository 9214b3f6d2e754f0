from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.alloc.alloc_support import DRIVER_KINDS, close_driver, make_driver, resources

from kvpolicy.alloc import Driver


@pytest.fixture(params=DRIVER_KINDS)
def driver(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """A host driver (fresh, 4 GiB), the CudaDriver over simulated bindings, or the GPU's driver.

    Fails the test if it leaves handles, mappings or reservations behind.
    """
    d = make_driver(request.param)
    before = resources(d)
    yield d
    d.clear_faults()
    leaked = resources(d)
    close_driver(d)
    assert leaked == before, f"driver resources (handles, mapped, reserved) went from {before} to {leaked}"
