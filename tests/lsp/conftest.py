"""A real ``kvpolicy lsp`` process per test, driven over its standard input and output."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pygls", reason="the lsp extra is not installed")

from tests.lsp.client import LspClient


@pytest.fixture
def client() -> Iterator[LspClient]:
    c = LspClient()
    try:
        yield c
    finally:
        c.close()
