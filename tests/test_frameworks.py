"""Framework hand-off: zero-copy through DLPack, structure kept, awkward arrays still handled."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from chute import DataLoader
from chute.frameworks import to_jax, to_torch

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")


def _batch() -> dict[str, object]:
    return {
        "x": np.arange(12, dtype=np.float32).reshape(4, 3),
        "ragged": (np.arange(6, dtype=np.int32), np.array([0, 2, 6], dtype=np.int64)),
        "meta": {"ids": np.array([1, 2], dtype=np.uint8)},
        "name": "kept",
    }


def test_to_torch_shares_memory() -> None:
    batch = _batch()
    out = to_torch(batch)
    assert isinstance(out["x"], torch.Tensor) and out["x"].dtype == torch.float32
    assert out["x"].data_ptr() == batch["x"].ctypes.data  # type: ignore[attr-defined]
    batch["x"][0, 0] = 42.0  # type: ignore[index]
    assert out["x"][0, 0].item() == 42.0
    values, splits = out["ragged"]
    assert isinstance(out["ragged"], tuple) and splits.tolist() == [0, 2, 6]
    assert values.dtype == torch.int32
    assert out["meta"]["ids"].tolist() == [1, 2]
    assert out["name"] == "kept"


def _aligned(array: np.ndarray, alignment: int = 64) -> np.ndarray:
    raw = np.empty(array.nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def test_to_jax_zero_copy_on_cpu() -> None:
    # XLA adopts a host buffer in place when it is aligned (numpy only guarantees 16 bytes).
    batch = _batch()
    batch["x"] = _aligned(batch["x"])  # type: ignore[arg-type]
    out = to_jax(batch)
    assert isinstance(out["x"], jax.Array)
    assert out["x"].unsafe_buffer_pointer() == batch["x"].ctypes.data  # type: ignore[attr-defined]
    np.testing.assert_array_equal(np.asarray(out["ragged"][0]), np.arange(6))
    assert out["meta"]["ids"].dtype == np.uint8
    assert out["name"] == "kept"


@pytest.mark.parametrize("convert", [to_torch, to_jax])
def test_arrays_dlpack_refuses_are_copied(convert: object) -> None:
    readonly = np.arange(6, dtype=np.int64)
    readonly.flags.writeable = False
    swapped = np.arange(5, dtype=">i4")
    strided = np.arange(10, dtype=np.float64)[::2]
    out = convert({"r": readonly, "s": swapped, "t": strided})  # type: ignore[operator]
    for key, ref in (("r", readonly), ("s", swapped), ("t", strided)):
        np.testing.assert_array_equal(np.asarray(out[key]), ref)


def test_loader_batches_hand_over_to_torch() -> None:
    streams = {"x": np.arange(40, dtype=np.float32).reshape(20, 2), "y": np.arange(20)}
    with DataLoader(streams, batch_size=5, transform=to_torch) as dl:
        batch = next(dl)
    assert batch["x"].shape == (5, 2) and torch.equal(batch["x"][:, 0], batch["y"].float() * 2)


def test_core_imports_no_framework() -> None:
    code = "import sys, chute; print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
