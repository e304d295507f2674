"""The per-image work of bench/transforms.py, in a module of its own so every contender's
worker processes import the same functions: JPEG decode (Pillow), a random 56x56 crop and a
random flip, optionally followed by a fixed amount of pure-Python work (``LOOPS`` iterations,
calibrated once to about 2 ms and handed to the workers through the environment)."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
from PIL import Image

SIDE, CROP = 64, 56
LOOPS_VAR = "CHUTE_BENCH_PY_LOOPS"


def decode(jpeg: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("L"))


def crop_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    top, left = (int(v) for v in rng.integers(0, SIDE - CROP + 1, size=2))
    out = image[top : top + CROP, left : left + CROP]
    return np.ascontiguousarray(out[:, ::-1] if rng.random() < 0.5 else out)


def python_work(loops: int) -> int:
    """Pure-Python work (the GIL held throughout): a string and dict workout."""
    acc = 0
    seen: dict[int, int] = {}
    for i in range(loops):
        acc = (acc * 31 + i) % 1_000_003
        seen[acc % 97] = i
    return acc + len(seen)


def loops() -> int:
    return int(os.environ.get(LOOPS_VAR, "0"))


def image(jpeg: bytes, rng: np.random.Generator, extra: bool) -> np.ndarray:
    out = crop_flip(decode(jpeg), rng)
    if extra:
        python_work(loops())
    return out


# chute: a map per workload
def chute_plain(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"image": image(record["jpeg"], rng, False)}


def chute_python(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"image": image(record["jpeg"], rng, True)}


# torch: a map-style dataset over the same bytes (its workers seed numpy per worker)
class TorchImages:
    def __init__(self, path: str, extra: bool) -> None:
        self.path, self.extra = path, extra
        self._ds: Any = None

    def __len__(self) -> int:
        return self._open().__len__()

    def _open(self) -> Any:
        if self._ds is None:
            import chute

            self._ds = chute.BytesDataset(self.path)
        return self._ds

    def __getitem__(self, i: int) -> np.ndarray:
        rng = np.random.default_rng(np.random.randint(1 << 31))
        return image(self._open()[int(i)], rng, self.extra)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "extra": self.extra, "_ds": None}


# Grain: a data source over the same bytes and a random map
class GrainSource:
    def __init__(self, path: str) -> None:
        self.path = path
        self._ds: Any = None

    def _open(self) -> Any:
        if self._ds is None:
            import chute

            self._ds = chute.BytesDataset(self.path)
        return self._ds

    def __len__(self) -> int:
        return len(self._open())

    def __getitem__(self, i: int) -> bytes:
        return bytes(self._open()[int(i)])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_ds": None}
