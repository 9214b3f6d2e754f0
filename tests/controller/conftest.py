"""Fixtures of the controller tests."""

from __future__ import annotations

import pytest

from tests.controller.site import Site


@pytest.fixture()
def site(tmp_path):
    s = Site(tmp_path)
    yield s
    s.close()
