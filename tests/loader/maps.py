"""Per-record maps and transforms for the worker tests: at a module's top level, so spawned
worker processes can import them."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np


def crop_flip(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A random crop to a random length (outputs of varying shapes) and a random flip."""
    x = record["x"]
    n = int(rng.integers(1, len(x) + 1))
    start = int(rng.integers(0, len(x) - n + 1))
    out = x[start : start + n]
    return {"x": out[::-1] if rng.random() < 0.5 else out, "draw": rng.random()}


def fixed_crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A random crop of a fixed size: the batch stacks into one array."""
    x = record["x"]
    start = int(rng.integers(0, len(x) - 4 + 1))
    return {"x": x[start : start + 4] * 2}


def noise(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A batch transform that draws: one number per batch."""
    return {**batch, "noise": rng.standard_normal(2)}


def identity(record: dict[str, Any]) -> dict[str, Any]:
    return record


def fail_on_seven(record: dict[str, Any]) -> dict[str, Any]:
    if int(record["x"][0]) == 7 * 16:
        raise KeyError("record seven")
    return record


def die_on_seven(record: dict[str, Any]) -> dict[str, Any]:
    """Kills its own worker process at record 7 while a flag file exists."""
    if int(record["x"][0]) == 7 * 16 and os.path.exists(os.environ["CHUTE_TEST_DIE"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return record


def sleep_on_seven(record: dict[str, Any]) -> dict[str, Any]:
    if int(record["x"][0]) == 7 * 16:
        time.sleep(60)
    return record


def decode_length(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A bytes record decoded (here: its bytes as uint8, shifted by a random draw)."""
    data = np.frombuffer(record["blob"], np.uint8)
    return {"n": len(record["blob"]), "sum": int(data.sum()) + int(rng.integers(0, 10))}


def draw(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The record and one number drawn for it."""
    return {"x": record["x"], "r": rng.random()}


def batch_draw(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The batch and one number drawn for it."""
    return {**batch, "t": rng.random()}


def sleep_once_on_seven(record: dict[str, Any]) -> dict[str, Any]:
    """Hangs at record 7 the first time only: creates the flag file it then finds."""
    flag = os.environ["CHUTE_TEST_HANG_ONCE"]
    if int(record["x"][0]) == 7 * 16 and not os.path.exists(flag):
        open(flag, "w").close()
        time.sleep(3600)
    return record


def keys_by_parity(record: dict[str, Any]) -> dict[str, Any]:
    """The same keys, listed in another order for odd records."""
    x = int(record["x"])
    return {"a": x, "b": -x} if x % 2 else {"b": -x, "a": x}


def decode(record: dict[str, Any]) -> dict[str, Any]:
    """The docs' augment, without the image library: bytes in, an array and the label out."""
    return {"image": np.frombuffer(record["blob"], np.uint8) + 1, "label": record["label"]}
