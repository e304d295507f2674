"""``out=`` arrays a gather cannot write into: an `OutBufferError` (still a ValueError and a
TypeError) naming what is wrong, on every gather that takes one: the store's, a sharded
dataset's, and `Dataset.gather_into`; an unfit buffer is refused before a byte is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import OutBufferError

ROWS = np.arange(20 * 4, dtype=np.int32).reshape(20, 4)  # 16 bytes a record
IDX = [3, 0, 17]


def _read_only() -> np.ndarray:
    out = np.zeros((3, 4), np.int32)
    out.flags.writeable = False
    return out


BAD: dict[str, tuple[Callable[[], Any], str]] = {
    "read-only": (_read_only, r"read-only \(not writeable\)"),
    "read-only bytes": (lambda: bytes(48), r"read-only"),
    "strided": (lambda: np.zeros((3, 8), np.int32)[:, ::2], "not C-contiguous"),
    "transposed": (lambda: np.zeros((4, 3), np.int32).T, "not C-contiguous"),
    "objects": (lambda: np.empty((3, 4), object), "dtype object"),
    "not a buffer": (lambda: [0] * 12, "must be a numpy array .* got list"),
}


@pytest.fixture(params=["single", "sharded"])
def dataset(request: pytest.FixtureRequest, tmp_path: Path) -> chute.Dataset:
    shards = 6 if request.param == "sharded" else None
    return chute.write_dataset(tmp_path / "d", ROWS, shard_records=shards)


def _gathers(ds: chute.Dataset) -> dict[str, Callable[[Any], object]]:
    store = ds.store
    return {
        "store.gather": lambda out: store.gather(IDX, out),
        "store.gather_into": lambda out: store.gather_into(IDX, out, [0, 16, 32]),
        "Dataset.gather_into": lambda out: ds.gather_into(IDX, out),
    }


CASES = [
    (call, bad)
    for call in ("store.gather", "store.gather_into", "Dataset.gather_into")
    for bad in BAD  # Dataset.gather_into takes numpy arrays only (its signature says so)
    if call != "Dataset.gather_into" or bad not in ("read-only bytes", "not a buffer")
]


@pytest.mark.parametrize(("call", "bad"), CASES)
def test_a_bad_out_is_named_and_left_untouched(dataset: chute.Dataset, call: str, bad: str) -> None:
    make, message = BAD[bad]
    out = make()
    before = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    with pytest.raises(OutBufferError, match=message) as raised:
        _gathers(dataset)[call](out)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, TypeError)
    assert isinstance(raised.value, chute.ChuteError)
    if before is not None and not out.dtype.hasobject:
        assert np.array_equal(out, before)
    good = np.zeros((3, 4), np.int32)  # the same call with a fit array still works
    _gathers(dataset)[call](good)
    assert np.array_equal(good, ROWS[IDX])


def test_a_wrong_size_dtype_or_shape_is_named(dataset: chute.Dataset) -> None:
    store = dataset.store
    with pytest.raises(OutBufferError, match="out has 47 bytes, not a multiple of 3 records"):
        store.gather(IDX, np.zeros(47, np.uint8))
    with pytest.raises(OutBufferError, match="does not fit in out at byte 32"):
        store.gather_into(IDX, np.zeros(47, np.uint8), [0, 16, 32])
    with pytest.raises(OutBufferError, match="out has dtype int64, the batch is int32"):
        dataset.gather_into(IDX, np.zeros((3, 4), np.int64))
    with pytest.raises(OutBufferError, match=r"out has shape \(2, 4\), the batch is \(3, 4\)"):
        dataset.gather_into(IDX, np.zeros((2, 4), np.int32))


def test_any_writable_buffer_of_the_right_size_is_a_fit_out(dataset: chute.Dataset) -> None:
    raw = bytearray(48)
    dataset.store.gather(IDX, raw)  # type: ignore[arg-type]
    assert np.array_equal(np.frombuffer(raw, np.int32).reshape(3, 4), ROWS[IDX])
