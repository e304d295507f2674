"""DataLoader's checks of what it is given: a sampler object's batch size and positions,
the range of steps it can read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader

MODES = ["sequential", "iid", "cyclic"]


class Returns:
    """A sampler object returning the same positions at every step, whatever is asked."""

    def __init__(self, out: Any, batch_size: Any = 4, length: int = 10) -> None:
        self.out, self.batch_size, self.length, self.step = out, batch_size, length, 0

    def seek(self, step: int) -> None:
        self.step = step

    def indices(self, step: int, start: int = 0, stop: int | None = None) -> Any:
        return self.out


@pytest.mark.parametrize(
    ("out", "problem"),
    [
        (np.array([-1, 0, 1, 2]), "position -1, negative"),
        (np.array([1, 2], np.uint64), "2 positions for a batch slice of 4"),
        (np.arange(10, dtype=np.uint64), "10 positions for a batch slice of 4"),
        (np.array([0, 1, 2, 10], np.uint64), r"position 10, outside \[0, 10\)"),
        (np.array([0.0, 1.0, 2.0, 3.0]), "positions of dtype float64, not integers"),
        (np.array([True, False, True, True]), "positions of dtype bool, not integers"),
        (np.zeros((2, 2), np.uint64), r"an array of shape \(2, 2\)"),
    ],
)
def test_what_a_sampler_object_returns_is_checked(out: Any, problem: str) -> None:
    with DataLoader({"x": np.arange(10)}, sampler=Returns(out), num_threads=1) as dl:
        dl.seek(5)
        with pytest.raises(
            chute.errors.SamplerError, match=f"sampler Returns at step 5 gave {problem}"
        ):
            next(dl)
        assert dl.step == 5


def test_a_sampler_object_is_checked_against_its_shard_and_subset() -> None:
    ok = np.array([2, 3], np.uint64)
    with DataLoader({"x": np.arange(10)}, sampler=Returns(ok), shard=(1, 2)) as dl:
        assert next(dl)["x"].tolist() == [2, 3]
    with DataLoader({"x": np.arange(10)}, sampler=Returns(np.arange(4), length=5),
                    indices=[9, 8, 7, 6, 5]) as dl:  # fmt: skip
        assert next(dl)["x"].tolist() == [9, 8, 7, 6]
    sampler = Returns(np.array([1, 5]), length=5)
    with (
        DataLoader(
            {"x": np.arange(10)}, sampler=sampler, indices=[9, 8, 7, 6, 5], shard=(0, 2)
        ) as dl,
        pytest.raises(chute.errors.SamplerError, match=r"position 5, outside \[0, 5\)"),
    ):
        next(dl)


class Grows(Returns):
    """A sampler object that widens its own ``length`` once the loader has checked it."""

    def indices(self, step: int, start: int = 0, stop: int | None = None) -> Any:
        self.length = 1000
        return self.out


def test_positions_are_checked_against_the_loaders_records_not_the_samplers_length() -> None:
    sampler = Grows(np.array([15, 500, 999, 0], np.uint64))
    with (
        DataLoader({"x": np.arange(10)}, sampler=sampler) as dl,
        pytest.raises(chute.errors.SamplerError, match=r"position 999, outside \[0, 10\)"),
    ):
        next(dl)


def test_batch_sizes_are_positive_integers() -> None:
    streams = {"x": np.arange(10)}
    for bad in (-3, 0):
        with pytest.raises(
            ValueError, match=r"batch_size of sampler Returns must be in \[1, 2\*\*64\)"
        ):
            DataLoader(streams, sampler=Returns(np.arange(4), batch_size=bad))
        with pytest.raises(ValueError, match=rf"batch_size must be in \[1, 2\*\*64\), got {bad}"):
            DataLoader(streams, batch_size=bad, sampler="iid")
    for bad in (2.0, True, "2"):
        with pytest.raises(TypeError, match="batch_size of sampler Returns must be an int"):
            DataLoader(streams, sampler=Returns(np.arange(2), batch_size=bad))
        with pytest.raises(TypeError, match="batch_size must be an int"):
            DataLoader(streams, batch_size=bad, sampler=Returns(np.arange(2), batch_size=2))
    with pytest.raises(ValueError, match=r"length of sampler Returns must be in \[1, 2\*\*64\)"):
        DataLoader(streams, sampler=Returns(np.arange(2), length=-1))
    with DataLoader(
        streams, batch_size=np.int64(2), sampler=Returns(np.arange(2), np.uint8(2))
    ) as dl:
        assert dl.batch_size == 2 and next(dl)["x"].tolist() == [0, 1]


def test_the_last_readable_step_is_2_64_minus_2() -> None:
    streams = {"x": np.arange(10)}
    for mode in MODES:
        with pytest.raises(ValueError, match=r"start_step must be in \[0, 2\*\*64 - 1\)"):
            DataLoader(streams, batch_size=2, sampler=mode, start_step=2**64 - 1)  # type: ignore[arg-type]
        with DataLoader(streams, 2, mode, start_step=2**64 - 2, num_threads=1) as dl:  # type: ignore[arg-type]
            expected = chute.Sampler(10, 2, mode, 0).indices(2**64 - 2)  # type: ignore[arg-type]
            assert next(dl)["x"].tolist() == expected.tolist()
            assert dl.step == 2**64 - 1
            with pytest.raises(StopIteration):  # the end of the step counter
                next(dl)
            with pytest.raises(ValueError, match=r"step must be in \[0, 2\*\*64 - 1\)"):
                dl.seek(2**64 - 1)
            with pytest.raises(ValueError, match=r"step must be in \[0, 2\*\*64 - 1\)"):
                dl.load_state_dict({**dl.state_dict(), "step": 2**64 - 1})
            dl.seek(3)
            assert next(dl)["x"].tolist() == chute.Sampler(10, 2, mode, 0).indices(3).tolist()  # type: ignore[arg-type]
