"""The recycling ring both loaders gather into: nothing referenced is ever handed out again."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from chute import DataLoader
from chute._util.buffers import BatchBuffers

F4 = np.dtype(np.float32)


def _pointer(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def test_a_dropped_array_is_reused_and_a_held_one_never() -> None:
    ring = BatchBuffers(keep=4)
    a = ring.empty((4, 3), F4)
    a[...] = 7
    b = ring.empty((4, 3), F4)
    assert not np.shares_memory(a, b)
    ptr = _pointer(b)
    del b
    c = ring.empty((2, 6), F4)  # same byte count, other shape: the same memory
    assert _pointer(c) == ptr and c.shape == (2, 6)
    assert (a == 7).all()


@pytest.mark.parametrize(
    "derive",
    [
        lambda a: a[1:],
        lambda a: a[::2][1:].T,
        lambda a: a.reshape(-1).view(np.uint8),
        lambda a: memoryview(a),
        lambda a: np.frombuffer(a, np.uint8),
        lambda a: {"nested": (a[0],)},
    ],
    ids=["slice", "view-of-view", "reinterpreted", "memoryview", "frombuffer", "in-a-tree"],
)
def test_anything_sharing_the_memory_keeps_it_out_of_reuse(derive: Any) -> None:
    ring = BatchBuffers(keep=8)
    a = ring.empty((4, 4), F4)
    ptr = _pointer(a)
    held = derive(a)
    del a
    gc.collect()
    for _ in range(6):
        assert _pointer(ring.empty((4, 4), F4)) != ptr
    del held
    gc.collect()
    assert _pointer(ring.empty((4, 4), F4)) == ptr


def test_framework_tensors_over_the_memory_keep_it() -> None:
    torch = pytest.importorskip("torch")
    from chute.frameworks import to_torch

    ring = BatchBuffers(keep=4)
    a = ring.empty((8,), F4)
    ptr = _pointer(a)
    tensors = [torch.from_numpy(a), to_torch({"a": a})["a"]]
    del a
    for t in tensors:
        assert t.data_ptr() == ptr
    assert all(_pointer(ring.empty((8,), F4)) != ptr for _ in range(3))
    del tensors, t
    assert _pointer(ring.empty((8,), F4)) == ptr


def test_allocator_is_used_checked_and_switchable() -> None:
    made: list[int] = []

    def allocate(nbytes: int) -> np.ndarray:
        made.append(nbytes)
        return np.empty(nbytes, np.uint8)

    ring = BatchBuffers(keep=4, allocate=allocate)
    a = ring.empty((3, 5), np.dtype(np.int16))
    assert made == [30] and a.dtype == np.int16
    del a
    remade: list[int] = []

    def again(nbytes: int) -> np.ndarray:
        remade.append(nbytes)
        return np.empty(nbytes, np.uint8)

    ring.allocate = again  # roots made the old way are not reused
    ring.empty((3, 5), np.dtype(np.int16))
    assert made == [30] and remade == [30]
    for bad in (lambda n: np.empty(n + 1, np.uint8), lambda n: np.empty(2 * n, np.uint8)[:n]):
        with pytest.raises(TypeError, match="allocator"):
            BatchBuffers(2, allocate=bad).empty((4,), F4)
    with pytest.raises(TypeError, match="objects"):
        ring.empty((2,), np.dtype(object))
    assert ring.empty((0, 3), F4).shape == (0, 3)
    with pytest.raises(ValueError, match="keep"):
        BatchBuffers(0)


def test_adopt_copies_foreign_arrays_in_and_keeps_own_and_other_leaves() -> None:
    ring = BatchBuffers(keep=8)
    own = ring.empty((3,), F4)
    own[...] = 1
    foreign = np.arange(4, dtype=np.int64)
    objects = np.array([None, 1], dtype=object)
    out = ring.adopt({"own": own, "t": (foreign, "s"), "o": objects, "n": 3})
    assert out["own"] is own and out["o"] is objects and out["n"] == 3 and out["t"][1] == "s"
    assert ring.owns(out["t"][0]) and not np.shares_memory(out["t"][0], foreign)
    np.testing.assert_array_equal(out["t"][0], foreign)
    assert not ring.owns(foreign)


def test_loader_gathering_into_a_ring_gives_the_same_batches_and_recycles() -> None:
    data = {"x": np.arange(600, dtype=np.float32).reshape(200, 3), "y": np.arange(200)}
    plain = DataLoader(data, batch_size=16, sampler="iid", seed=5, num_threads=1)
    expected = [next(plain) for _ in range(30)]
    with DataLoader(data, batch_size=16, sampler="iid", seed=5, num_threads=3) as dl:
        ring = BatchBuffers(keep=32)
        dl.use_buffers(ring)
        held = []
        pointers = set()
        for k, want in enumerate(expected):
            batch = next(dl)
            assert ring.owns(batch["x"]) and ring.owns(batch["y"])
            pointers.add(_pointer(batch["x"]))
            if k % 5 == 0:
                held.append((batch, {n: a.copy() for n, a in batch.items()}))
            np.testing.assert_array_equal(batch["x"], want["x"])
            np.testing.assert_array_equal(batch["y"], want["y"])
            del batch
        for batch, copy in held:  # batches still held were never written over
            for name in copy:
                np.testing.assert_array_equal(batch[name], copy[name])
        assert len(pointers) < 30  # memory was recycled
    plain.close()


def test_transform_output_is_copied_into_the_ring() -> None:
    data = {"x": np.arange(40, dtype=np.uint8).reshape(20, 2)}

    def scale(batch: dict[str, Any]) -> dict[str, Any]:
        return {"x": batch["x"].astype(np.float32) / 2, "raw": batch["x"]}

    with DataLoader(data, batch_size=4, sampler="sequential", transform=scale, num_threads=1) as dl:
        ring = BatchBuffers(keep=16)
        dl.use_buffers(ring)
        batch = next(dl)
        assert ring.owns(batch["x"]) and ring.owns(batch["raw"])
        np.testing.assert_array_equal(batch["x"], np.arange(8).reshape(4, 2) / 2)


def test_a_ring_sizes_its_arrays_without_numpy_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = BatchBuffers(keep=4)
    first = ring.empty((16, 3, 5), F4)
    pointer = _pointer(first)
    del first

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("np.prod runs in every batch's empty()")

    monkeypatch.setattr(np, "prod", refused)
    again = ring.empty((16, 15), F4)  # same bytes: the root is reused
    assert again.shape == (16, 15) and _pointer(again) == pointer
    assert ring.empty((np.int64(2), 3), np.dtype(np.int16)).nbytes == 12


def test_prepare_runs_on_the_worker_threads_after_the_ring() -> None:
    import threading

    seen: list[tuple[str, bool]] = []
    ring = BatchBuffers(keep=16)

    def prepare(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append((threading.current_thread().name, ring.owns(batch["x"])))
        return {**batch, "prepared": True}

    data = {"x": np.arange(40, dtype=np.float32).reshape(20, 2)}
    with DataLoader(data, batch_size=4, sampler="sequential", num_threads=2) as dl:
        dl.use_buffers(ring, prepare)
        assert all(next(dl)["prepared"] for _ in range(5))
        dl.use_buffers(None, prepare)  # no ring: nothing for a device stage to prepare
        dl.seek(0)
        assert "prepared" not in next(dl)
    assert len(seen) >= 5 and all(owned for _, owned in seen)
    assert all(name.startswith("chute-loader") for name, _ in seen)
