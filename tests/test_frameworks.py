"""Framework hand-off: zero-copy through DLPack, structure kept, awkward arrays still handled."""

from __future__ import annotations

import re
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


@pytest.mark.filterwarnings("ignore:JAX has 64-bit types off")
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


@pytest.mark.filterwarnings("ignore:JAX has 64-bit types off")
@pytest.mark.parametrize("convert", [to_torch, to_jax])
def test_arrays_dlpack_refuses_are_copied(convert: object) -> None:
    readonly = np.arange(6, dtype=np.int64)
    readonly.flags.writeable = False
    swapped = np.arange(5, dtype=">i4")
    strided = np.arange(10, dtype=np.float64)[::2]
    out = convert({"r": readonly, "s": swapped, "t": strided})  # type: ignore[operator]
    for key, ref in (("r", readonly), ("s", swapped), ("t", strided)):
        np.testing.assert_array_equal(np.asarray(out[key]), ref)


def test_to_torch_copies_a_negative_stride_array_without_aborting() -> None:
    # from_dlpack aborts the interpreter (c10::Error) on a negative stride: run in a child,
    # so a signal fails the test instead of killing pytest.
    code = (
        "import numpy as np, chute; from chute.frameworks import to_torch, to_device\n"
        "flip = lambda b: {'image': b['image'][:, :, ::-1]}\n"
        "images = np.arange(128, dtype=np.uint8).reshape(8, 4, 4)\n"
        "with chute.DataLoader({'image': images}, batch_size=4, sampler='sequential',"
        " transform=flip) as dl:\n"
        "    b = next(dl)\n"
        "    t = to_torch(b)['image']\n"
        "    assert b['image'].strides[-1] < 0 and t.data_ptr() != b['image'].ctypes.data\n"
        "    assert (t.numpy() == images[:4, :, ::-1]).all()\n"
        "    assert (to_torch(images[::-1, ::-1]).numpy() == images[::-1, ::-1]).all()\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_to_torch_shares_only_memory_torch_may_write() -> None:
    memory = bytes(8)
    readonly = np.frombuffer(memory, np.uint8)
    tensor = to_torch({"x": readonly})["x"]
    assert tensor.data_ptr() != readonly.ctypes.data
    tensor[0] = 42
    assert memory == bytes(8)  # the immutable bytes object is untouched
    unaligned = np.zeros(17, np.uint8)[1:].view(np.int32)
    assert to_torch(unaligned).data_ptr() != unaligned.ctypes.data
    views = np.arange(12.0).reshape(3, 4)[::2, 1:]  # positive strides: shared
    assert to_torch(views).data_ptr() == views.ctypes.data


@pytest.mark.parametrize(
    ("array", "hint"),
    [
        (np.array([b"ab", b"cde"], "S5"), "view it as uint8"),
        (np.array(["a", "bc"]), "decode it to str"),
        (np.array(["2020-01-01"], "datetime64[D]"), "int64"),
        (np.zeros(2, [("a", "i4"), ("b", "f4")]), "fields"),
        (np.array([1, "a"], object), "numeric"),
        (np.zeros(2, np.longdouble), "numeric"),
    ],
)
def test_to_torch_names_the_key_of_a_dtype_torch_cannot_hold(array: np.ndarray, hint: str) -> None:
    if array.dtype == np.float64:
        pytest.skip("long double is float64 here")
    dtype = re.escape(str(array.dtype))
    with pytest.raises(TypeError, match=f"batch key 'meta/name'.*{dtype}.*{hint}"):
        to_torch({"x": np.arange(3), "meta/name": array})


def test_loader_batches_hand_over_to_torch() -> None:
    streams = {"x": np.arange(40, dtype=np.float32).reshape(20, 2), "y": np.arange(20)}
    with DataLoader(streams, batch_size=5, transform=to_torch) as dl:
        batch = next(dl)
    assert batch["x"].shape == (5, 2) and torch.equal(batch["x"][:, 0], batch["y"].float() * 2)


def test_core_imports_no_framework() -> None:
    code = "import sys, chute; print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which dtypes were already warned about (the warning comes once per process)."""
    from chute.frameworks import _jax

    monkeypatch.setattr(_jax, "_warned", set())


@pytest.mark.usefixtures("fresh_warnings")
def test_to_jax_narrows_64_bit_arrays_visibly_once() -> None:
    from chute.errors import ChuteError, NarrowingError

    big = np.array([1, 2**31 - 1, -(2**31)], dtype=np.int64)
    with pytest.warns(UserWarning, match="arrays become") as seen:
        out = to_jax({"a": big, "b": big[:2].copy(), "f": np.arange(3.0)})
    messages = sorted(str(w.message).split(": ")[1].split(" (")[0] for w in seen)
    assert messages == ["float64 arrays become float32", "int64 arrays become int32"]
    assert out["a"].dtype == np.int32 and np.asarray(out["a"]).tolist() == big.tolist()
    assert out["f"].dtype == np.float32
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second batch: no second warning
        to_jax({"a": big})
    for overflow in (np.array([2**31], np.int64), np.array([2**40], np.uint64)):
        with pytest.raises(NarrowingError, match="jax_enable_x64") as info:
            to_jax({"ids": overflow})
        assert isinstance(info.value, ChuteError) and isinstance(info.value, ValueError)


def test_to_jax_keeps_64_bits_when_x64_is_on() -> None:
    code = (
        "import jax, numpy as np, warnings; jax.config.update('jax_enable_x64', True);"
        "warnings.simplefilter('error'); from chute.frameworks import to_jax;"
        "a = to_jax({'a': np.array([2**40], np.int64)})['a'];"
        "print(a.dtype, int(a[0]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["int64", str(2**40)]


@pytest.mark.usefixtures("fresh_warnings")
def test_the_jax_device_stage_narrows_the_same_way() -> None:
    from chute.errors import NarrowingError
    from chute.frameworks import to_device

    streams = {"y": np.arange(40, dtype=np.int64)}
    dev = to_device(DataLoader(streams, batch_size=4), framework="jax")
    with pytest.warns(UserWarning, match="int64"), dev:
        assert next(dev)["y"].dtype == np.int32
    huge = {"y": np.full(40, 2**35, dtype=np.int64)}
    with to_device(DataLoader(huge, batch_size=4), framework="jax") as dev:
        with pytest.raises(NarrowingError):
            next(dev)
        assert dev.step == 0
