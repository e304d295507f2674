"""The device stage over chute.insitu views, on CPU: same batches, exact resume, errors."""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute.frameworks import DeviceView, to_device
from chute.insitu import InSituDataset
from tests.batches_util import assert_same_batches

from .test_dataset import dataset

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

FRAMEWORKS = [("torch", "cpu"), ("jax", None)]
KW: dict[str, Any] = {"batch_size": 10, "seed": 4, "block_chunks": 3}


def _host(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.items()}


@pytest.fixture
def reference(archive: Path) -> list[dict[str, np.ndarray]]:
    with dataset(archive, **KW) as ds:
        return [{k: v.copy() for k, v in b.items()} for b in ds.train]


@pytest.mark.parametrize(("framework", "device"), FRAMEWORKS)
@pytest.mark.filterwarnings("ignore:JAX has 64-bit types off")
def test_a_view_delivers_the_same_passes_on_the_device(
    archive: Path, reference: list[dict[str, np.ndarray]], framework: str, device: Any
) -> None:
    with dataset(archive, **KW) as ds:
        view = to_device(ds.train, device, depth=3, framework=framework)  # type: ignore[arg-type]
        assert isinstance(view, DeviceView) and len(view) == len(reference)
        got = list(view)
        kind = torch.Tensor if framework == "torch" else jax.Array
        assert all(isinstance(v, kind) for b in got for v in b.values())
        assert_same_batches(got, reference)
        assert ds.state_dict()["positions"]["train"] == 0  # a whole pass: the next starts over
        assert_same_batches(list(view), reference)


def test_the_page_locked_allocator_reaches_the_dataset(archive: Path) -> None:
    made: list[int] = []

    class Mover:
        def allocate(self, nbytes: int) -> np.ndarray:
            made.append(nbytes)
            return np.empty(nbytes, np.uint8)

        def prepare(self, batch: Any) -> Any:
            return batch

        def start(self, batch: Any) -> tuple[Any, Any]:
            class Done:
                def done(self) -> bool:
                    return True

                def wait(self) -> None:
                    return None

            return {k: np.array(v) for k, v in batch.items()}, Done()

        def hand_over(self, batch: Any, ticket: Any) -> Any:
            return batch

    with dataset(archive, **KW) as ds:
        batches = list(DeviceView(ds.train, Mover(), depth=2))  # type: ignore[arg-type]
    # the pipeline holds a bounded number of batches, fewer than the pass: roots are recycled
    assert made and len(made) < len(batches) * len(batches[0])


@pytest.mark.parametrize("depth", [1, 4])
def test_resume_after_a_break_is_exact_despite_batches_in_flight(
    archive: Path, reference: list[dict[str, np.ndarray]], depth: int
) -> None:
    with dataset(archive, **KW) as ds:
        view = to_device(ds.train, "cpu", depth=depth)
        got = []
        for batch in view:
            got.append(batch)
            if len(got) == 4:
                assert view.state_dict()["positions"]["train"] == 4  # while batches are ahead
                break
        state = json.loads(json.dumps(view.state_dict()))
        assert state["positions"]["train"] == 4
        assert ds.state_dict() == state  # the dataset itself was put back at the delivered
    with dataset(archive, **KW) as ds:
        ds.load_state_dict(state)
        got += list(to_device(ds.train, "cpu", depth=2))
    assert_same_batches(got, reference)


def test_an_error_ends_the_pass_after_the_batches_before_it(
    archive: Path, reference: list[dict[str, np.ndarray]]
) -> None:
    failing = {"on": True, "seen": 0}

    def flaky(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        failing["seen"] += 1
        if failing["on"] and failing["seen"] == 6:
            raise OSError("transform broke")
        return batch

    with dataset(archive, batch_transforms=[flaky], **KW) as ds:
        view = to_device(ds.train, "cpu", depth=3)
        got = []
        with pytest.raises(OSError, match="transform broke"):
            for batch in view:
                got.append(batch)
        assert len(got) == 5
        assert view.state_dict()["positions"]["train"] == 5
        failing["on"] = False
        got += list(view)  # the next pass continues at the failed batch
    assert_same_batches(got, reference)


def test_a_dataset_itself_is_not_a_source(archive: Path) -> None:
    with dataset(archive, **KW) as ds:
        assert isinstance(ds, InSituDataset)
        with pytest.raises(TypeError, match=r"ds\.train"):
            to_device(ds, "cpu")


def test_load_state_dict_mid_pass_drops_the_batches_copied_ahead(
    archive: Path, reference: list[dict[str, np.ndarray]]
) -> None:
    from chute.errors import StateMismatchError

    with dataset(archive, **KW) as ds:
        view = to_device(ds.train, "cpu", depth=3)
        it = iter(view)
        got = [next(it) for _ in range(2)]
        state = json.loads(json.dumps(view.state_dict()))
        for _ in range(3):
            next(it)  # read past the checkpoint, then go back to it
        view.load_state_dict(state)
        with pytest.raises(StopIteration):
            next(it)  # the running pass was ended, its copies in flight dropped
        assert ds.state_dict() == state
        got += list(view)
        foreign = {**state, "config": {**state["config"], "seed": 99}}
        with pytest.raises(StateMismatchError, match="seed: saved 99, current 4"):
            view.load_state_dict(foreign)
    assert_same_batches(got, reference)


def test_a_plain_iterable_has_no_state_to_load() -> None:
    view = to_device([{"x": np.arange(3)}], "cpu")
    with pytest.raises(TypeError, match="no state to save or load"):
        view.load_state_dict({})


def test_every_array_of_a_batch_is_staged_in_the_ring_on_the_gather_thread(
    archive: Path, reference: list[dict[str, np.ndarray]]
) -> None:
    """``sample_indices`` and what batch transforms make are copied into the (page-locked,
    with CUDA) ring too, so the copy to the device reads no pageable memory; the device
    stage's ``prepare`` then runs on the gather thread, for its passes only."""
    roots: list[weakref.ref[np.ndarray]] = []
    prepared_on: list[str] = []
    staged: list[tuple[str, bool]] = []

    def in_ring(leaf: np.ndarray) -> bool:
        return any(leaf.base is r() for r in roots)

    class Mover:
        def allocate(self, nbytes: int) -> np.ndarray:
            root = np.empty(nbytes, np.uint8)
            roots.append(weakref.ref(root))
            return root

        def prepare(self, batch: Any) -> Any:
            prepared_on.append(threading.current_thread().name)
            return batch

        def start(self, batch: Any) -> tuple[Any, Any]:
            staged.extend((key, in_ring(leaf)) for key, leaf in batch.items())
            return {k: np.array(v) for k, v in batch.items()}, _Done()

        def hand_over(self, batch: Any, ticket: Any) -> Any:
            return batch

    def derive(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch["x2"] = batch["x"] * 2.0  # a new array
        batch["z"] = batch["z"][:, ::-1]  # a view of a ring array: stays as it is
        return batch

    with dataset(archive, batch_transforms=[derive], **KW) as ds:
        got = list(DeviceView(ds.train, Mover(), depth=2))  # type: ignore[arg-type]
        plain = next(iter(ds.val))  # not through the device stage: not prepared
    assert {key for key, _ in staged} == {"x", "x2", "y", "z", "sample_indices"}
    assert all(owned for _, owned in staged)
    assert len(prepared_on) == len(got) == len(reference)
    assert all(name.startswith("chute-insitu-gather") for name in prepared_on)
    assert "x2" in plain and not in_ring(plain["sample_indices"])
    for g, w in zip(got, reference, strict=True):
        np.testing.assert_array_equal(g["x2"], w["x"] * 2.0)
        np.testing.assert_array_equal(g["z"], w["z"][:, ::-1])
        np.testing.assert_array_equal(g["sample_indices"], w["sample_indices"])


class _Done:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None
