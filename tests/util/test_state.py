"""One state contract for everything resumable (chute._util.state), walked object by object.

In the manner of torchdata.nodes' save/load tests: each resumable object is stopped at
several points (before anything, after one batch, mid-epoch, at and past an epoch's end, at
the end), its ``state_dict()`` goes through JSON into a fresh object's ``load_state_dict``,
and the resumed stream must equal the uninterrupted one batch for batch. Then a state of
another configuration must be refused by the one validator, naming each differing field
with its saved and current value.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader, EvalPass, Sampler, StepSampler, WeightedSampler, iterate
from chute._util.state import Resumable, StateLayout, check_state, fingerprint, make_state
from chute.errors import StateMismatchError

N = 50
Batch = dict[str, np.ndarray]


def _streams() -> dict[str, np.ndarray]:
    return {"x": np.arange(N) * 10, "y": np.arange(2 * N).reshape(N, 2)}


class Reversed(StepSampler):
    """A user's sampler on chute's base class."""

    def fill(self, step: int, start: int, out: np.ndarray) -> None:
        first = step * self.batch_size + start
        out[:] = self.length - 1 - (np.arange(first, first + len(out)) % self.length)


class Every3rd:
    """A user's sampler written against the protocol only: no state of its own."""

    def __init__(self, length: int, batch_size: int) -> None:
        self.length, self.batch_size, self.step = length, batch_size, 0

    def seek(self, step: int) -> None:
        self.step = step

    def indices(self, step: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        stop = self.batch_size if stop is None else stop
        pos = np.arange(step * self.batch_size + start, step * self.batch_size + stop)
        return (pos * 3 % self.length).astype(np.uint64)


# -- taking batches from each kind of object -------------------------------------------------


def _host(batch: Any) -> Batch:
    if isinstance(batch, np.ndarray):
        return {"indices": batch.copy()}
    return {k: np.asarray(v).copy() for k, v in batch.items()}


def take_next(obj: Any, n: int) -> list[Batch]:
    """Up to ``n`` batches of an iterator (a loader, a pass, a sampler, a device loader)."""
    return [_host(b) for b in itertools.islice(obj, n)]


def _view_of(obj: Any) -> Any:
    return obj if hasattr(obj, "source") else obj.train


def _dataset_of(obj: Any) -> Any:
    return obj.source.dataset if hasattr(obj, "source") else obj


def _position(obj: Any) -> int:
    return int(obj.state_dict()["positions"]["train"])


def take_passes(obj: Any, n: int) -> list[Batch]:
    """``n`` train batches of an insitu dataset (or of a device view over its ``train``), one
    pass after another, as a training loop reads them: the next epoch is selected as soon as
    a pass's last batch was taken, so a state saved there starts the next epoch."""
    view, ds = _view_of(obj), _dataset_of(obj)
    out: list[Batch] = []
    while len(out) < n:
        it = iter(view)
        finished = False
        for batch in it:
            out.append(_host(batch))
            finished = _position(obj) == len(view)
            if finished or len(out) == n:
                break
        it.close()
        if finished:
            ds.set_epoch(ds.epoch + 1)
    return out


# -- the objects -------------------------------------------------------------------------------


@dataclass
class Case:
    make: Callable[[], Any]
    take: Callable[[Any, int], list[Batch]]
    epoch: int  # batches in a cycle, a pass or an epoch
    finite: bool = False  # an evaluation pass: it ends after `epoch` batches

    def stops(self) -> list[int]:
        if self.finite:
            return sorted({0, 1, self.epoch // 2, self.epoch})
        return sorted({0, 1, self.epoch // 2, self.epoch, self.epoch + 1, 2 * self.epoch + 1})

    def total(self) -> int:
        return self.epoch if self.finite else 2 * self.epoch + 3


def close(obj: Any) -> None:
    """Close what the object holds (a device view: its dataset); a sampler holds nothing."""
    if hasattr(obj, "source"):
        obj.source.dataset.close()
    elif hasattr(obj, "close"):
        obj.close()


def _loader(**kw: Any) -> Callable[[], DataLoader]:
    return lambda: DataLoader(_streams(), num_threads=2, prefetch=3, **kw)


SUBSET = chute.split(N, [0.7, 0.3], seed=4)[0]  # 35 members


def _cases() -> dict[str, Case]:
    cases = {
        f"loader-{mode}": Case(_loader(batch_size=8, sampler=mode, seed=3), take_next, N // 8)
        for mode in ("cyclic", "iid", "sequential")
    }
    weights = np.linspace(0.0, 1.0, N)
    cases |= {
        "loader-weighted": Case(
            lambda: DataLoader(_streams(), sampler=WeightedSampler(weights, 8, seed=2)),
            take_next,
            N // 8,
        ),
        "loader-step-sampler": Case(
            lambda: DataLoader(_streams(), sampler=Reversed(N, 8, seed=5)), take_next, N // 8
        ),
        "loader-protocol-sampler": Case(
            lambda: DataLoader(_streams(), sampler=Every3rd(N, 8)), take_next, N // 8
        ),
        "loader-subset": Case(_loader(batch_size=8, indices=SUBSET, seed=1), take_next, 35 // 8),
        "loader-shard": Case(_loader(batch_size=8, shard=(1, 2), seed=1), take_next, N // 8),
        "loader-subset-shard": Case(
            _loader(batch_size=8, indices=SUBSET, shard=(0, 4), sampler="iid"), take_next, 4
        ),
        "pass": Case(lambda: iterate(_streams(), 8, num_threads=2), take_next, 7, finite=True),
        "pass-pad-subset-shard": Case(
            lambda: EvalPass(_streams(), 8, indices=SUBSET, last="pad", shard=(1, 2)),
            take_next,
            5,
            finite=True,
        ),
        "loader-epoch": Case(
            lambda: DataLoader(_streams(), batch_size=8, indices=SUBSET).epoch(batch_size=6),
            take_next,
            6,
            finite=True,
        ),
    }
    cases |= {
        f"sampler-{mode}": Case(lambda mode=mode: Sampler(N, 8, mode, seed=7), take_next, 6)
        for mode in ("cyclic", "iid", "sequential")
    }
    cases["sampler-weighted"] = Case(lambda: WeightedSampler(weights, 8, seed=7), take_next, 6)
    cases["sampler-step-sampler"] = Case(lambda: Reversed(N, 8, seed=5), take_next, 6)
    return cases


CASES = _cases()


def check_resumes(case: Case) -> None:
    """Stopped at each of ``case.stops()``, saved, JSON round-tripped and loaded into a fresh
    object, the stream goes on exactly as the uninterrupted one."""
    whole = case.make()
    expected = case.take(whole, case.total())
    close(whole)
    if case.finite:
        assert len(expected) == case.epoch
    for stop in case.stops():
        first = case.make()
        head = case.take(first, stop)
        state = json.loads(json.dumps(first.state_dict()))
        close(first)
        second = case.make()
        assert isinstance(second, Resumable)
        second.load_state_dict(state)
        tail = case.take(second, case.total() - stop)
        close(second)
        got = head + tail
        assert len(got) == len(expected), stop
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert a.keys() == b.keys(), (stop, i)
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"stop {stop}, batch {i}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_object_resumes_the_uninterrupted_stream(name: str) -> None:
    check_resumes(CASES[name])


# -- the in-place dataset and the device stage -------------------------------------------------


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("zarr")
    from tests.insitu.conftest import write_archive

    path = tmp_path_factory.mktemp("state") / "data.zarr"
    write_archive(str(path))
    return path


def _insitu(archive: Path, **kw: Any) -> Callable[[], Any]:
    from tests.insitu.test_dataset import dataset

    return lambda: dataset(archive, **{"batch_size": 16, "block_chunks": 3, "seed": 1, **kw})


def _epoch_of(make: Callable[[], Any]) -> int:
    obj = make()
    try:
        return len(_view_of(obj))
    finally:
        close(obj)


@pytest.mark.parametrize(
    "kw", [{}, {"shard": (1, 2)}, {"shuffle": False}], ids=["shuffled", "shard", "in-order"]
)
def test_an_insitu_dataset_resumes_the_uninterrupted_passes(
    archive: Path, kw: dict[str, Any]
) -> None:
    make = _insitu(archive, **kw)
    check_resumes(Case(make, take_passes, _epoch_of(make)))


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


def test_a_device_loader_on_cpu_resumes_the_uninterrupted_stream(torch: Any) -> None:
    from chute.frameworks import to_device

    make = _loader(batch_size=8, seed=3, indices=SUBSET)
    check_resumes(Case(lambda: to_device(make(), "cpu", depth=2), take_next, 35 // 8))
    check_resumes(
        Case(lambda: to_device(iterate(_streams(), 8), "cpu", depth=3), take_next, 7, True)
    )


def test_a_device_view_on_cpu_resumes_the_uninterrupted_passes(archive: Path, torch: Any) -> None:
    from chute.frameworks import to_device

    dataset = _insitu(archive)

    def make() -> Any:
        return to_device(dataset().train, "cpu", depth=2)

    check_resumes(Case(make, take_passes, _epoch_of(make)))


# -- one validator: foreign states are refused, naming each field ------------------------------


def _refusals(archive: Path | None) -> Iterator[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    """(what ours says, a maker of the saving object, a maker of a differently set one)."""
    yield ("loader", _loader(batch_size=8, seed=1), _loader(batch_size=10, seed=2))
    yield ("loader", _loader(batch_size=8, indices=SUBSET), _loader(batch_size=8))
    yield (
        "pass",
        lambda: iterate(_streams(), 8),
        lambda: iterate(_streams(), 8, last="pad", indices=SUBSET),
    )
    yield ("current", lambda: Sampler(N, 8, "cyclic", 1), lambda: Sampler(N + 1, 8, "iid", 2))
    yield (
        "current",
        lambda: WeightedSampler(np.ones(N), 8),
        lambda: WeightedSampler(np.arange(N) + 1.0, 8),
    )
    if archive is not None:
        yield ("current", _insitu(archive, seed=1), _insitu(archive, seed=2, batch_size=8))


@pytest.mark.parametrize("index", range(6))
def test_a_state_of_another_configuration_names_each_differing_field(
    index: int, archive: Path
) -> None:
    ours, make, make_other = list(_refusals(archive))[index]
    saving = make()
    state = json.loads(json.dumps(saving.state_dict()))
    close(saving)
    other = make_other()
    position = other.state_dict()
    with pytest.raises(StateMismatchError) as info:
        other.load_state_dict(state)
    error = info.value
    assert isinstance(error, ValueError) and isinstance(error, chute.ChuteError)
    assert error.differences
    saved = state.get("config", state)
    current = position.get("config", position)
    for field, (was, now) in error.differences.items():
        assert (was, now) == (saved[field], current[field])
        assert f"{field}: saved {was!r}, {ours} {now!r}" in str(error)
    config = set(current) - {"version", "kind", "fingerprint", "step", "epoch", "positions"}
    assert set(error.differences) == {k for k in config if saved.get(k) != current[k]}
    assert other.state_dict() == position  # nothing moved
    close(other)


def test_a_state_of_another_kind_is_refused_naming_its_kind(archive: Path) -> None:
    with DataLoader(_streams(), batch_size=8) as loader:
        loader_state = loader.state_dict()
    sampler_state = Sampler(N, 8).state_dict()
    with iterate(_streams(), 8) as p, pytest.raises(StateMismatchError) as info:
        p.load_state_dict(loader_state)
    assert info.value.differences == {"kind": ("DataLoader", "EvalPass")}
    with DataLoader(_streams(), batch_size=8) as loader, pytest.raises(StateMismatchError):
        loader.load_state_dict(sampler_state)
    with _insitu(archive)() as ds, pytest.raises(StateMismatchError, match="kind: saved"):
        ds.load_state_dict(loader_state)
    with pytest.raises(StateMismatchError, match="not a chute StepSampler state"):
        Sampler(N, 8).load_state_dict([3])  # type: ignore[arg-type]


def test_states_saved_before_the_one_contract_still_load(archive: Path) -> None:
    """Today's layouts, as chute wrote them before states had ``kind`` and ``fingerprint``."""
    with DataLoader(_streams(), batch_size=8, seed=3) as loader:
        new = loader.state_dict()
        assert set(new) == {"version", "kind", "step", "seed", "sampler", "batch_size",
                            "length", "indices", "fingerprint"}  # fmt: skip
        loader.load_state_dict({"version": 2, "step": 5, "seed": 3, "sampler": "cyclic",
                                "batch_size": 8, "length": N, "indices": None})  # fmt: skip
        assert loader.step == 5
        loader.load_state_dict({"version": 1, "step": 6, "seed": 3, "sampler": "cyclic",
                                "batch_size": 8, "length": N})  # fmt: skip
        assert loader.step == 6
    with iterate(_streams(), 8) as p:
        p.load_state_dict({"version": 1, "step": 2, "pass": "partial", "batch_size": 8,
                           "length": N, "indices": None})  # fmt: skip
        assert [b["x"][0] for b in p] == [160, 240, 320, 400, 480]
    with _insitu(archive)() as ds:
        it = iter(ds.train)
        next(it)
        state = ds.state_dict()
        it.close()
        old = {"version": 2, "epoch": 0, "positions": state["positions"], "config": state["config"]}
    with _insitu(archive)() as ds:
        ds.load_state_dict(old)
        assert ds.train.position == 1


def test_the_fingerprint_is_checked(archive: Path) -> None:
    with DataLoader(_streams(), batch_size=8) as loader:
        state = loader.state_dict()
        assert state["fingerprint"] == fingerprint(
            {k: state[k] for k in ("seed", "sampler", "batch_size", "length", "indices")}
        )
        with pytest.raises(StateMismatchError, match="fingerprint: saved 'x'") as info:
            loader.load_state_dict({**state, "fingerprint": "x"})
        assert set(info.value.differences) == {"fingerprint"}
    with _insitu(archive)() as ds, pytest.raises(StateMismatchError, match="fingerprint"):
        ds.load_state_dict({**ds.state_dict(), "fingerprint": "0" * 16})


def test_the_validator_reports_versions_and_missing_positions() -> None:
    layout = StateLayout("Counter", (3, 2), ("step",))
    state = make_state(layout, {"seed": 1}, step=4)
    assert check_state({**state, "version": 2}, layout, {"seed": 1})["step"] == 4
    with pytest.raises(StateMismatchError, match=r"version: saved 1, current 3 \(this chute"):
        check_state({**state, "version": 1}, layout, {"seed": 1})
    with pytest.raises(StateMismatchError, match="it has no 'step'"):
        check_state({k: v for k, v in state.items() if k != "step"}, layout, {"seed": 1})
    with pytest.raises(TypeError, match="JSON-able"):
        make_state(layout, {"seed": object()}, step=0)


def test_every_resumable_object_is_a_resumable(archive: Path, torch: Any) -> None:
    from chute.frameworks import to_device

    with _insitu(archive)() as ds:
        objects = [
            DataLoader(_streams(), batch_size=4),
            iterate(_streams(), 4),
            Sampler(N, 4),
            WeightedSampler(np.ones(N), 4),
            ds,
            to_device(DataLoader(_streams(), batch_size=4), "cpu"),
            to_device(ds.train, "cpu"),
        ]
        assert all(isinstance(o, Resumable) for o in objects)
        for o in objects[:2] + objects[-2:-1]:
            o.close()


def test_a_refused_state_moves_nothing(archive: Path, torch: Any) -> None:
    """Not even where batches were read ahead (a device loader) or where the state is only
    partly wrong (an insitu state with one bad position)."""
    from chute.frameworks import to_device

    make = _loader(batch_size=8, seed=3)
    with make() as whole:
        expected = take_next(whole, 6)
    with to_device(make(), "cpu", depth=2) as dev:
        got = take_next(dev, 3)
        with pytest.raises(StateMismatchError, match="seed: saved 4, loader 3"):
            dev.load_state_dict({**dev.state_dict(), "seed": 4})
        assert dev.step == 3
        got += take_next(dev, 3)
    assert [b["x"].tolist() for b in got] == [b["x"].tolist() for b in expected]
    with _insitu(archive)() as ds:
        ds.set_epoch(1)
        before = ds.state_dict()
        bad = {**before, "epoch": 2, "positions": {"train": 1, "val": 10**6}}
        with pytest.raises(ValueError, match="bad position"):
            ds.load_state_dict(bad)
        assert ds.state_dict() == before
