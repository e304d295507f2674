from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def record(i: int, size: int | None = None) -> bytes:
    """Deterministic content for record i: compressible, distinct per record."""
    rng = np.random.default_rng(i)
    n = int(rng.integers(0, 3000)) if size is None else size
    return (np.arange(n, dtype=np.uint32) * (i + 1) // 7).astype(np.uint8).tobytes()


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store.zr"
