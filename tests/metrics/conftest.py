"""The headless browser the dashboard's page tests share (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .browser_util import chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b
