"""DataLoader: exact resume, step order under threading, sharding, errors that surface."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import DataLoader

MODES = ["sequential", "iid", "cyclic"]
N = 1000


class Fake:
    """An in-memory stream that records which threads gathered from it."""

    def __init__(self, array: npt.NDArray[Any], delay: float = 0.0) -> None:
        self.array = array
        self.delay = delay
        self.threads: set[str] = set()

    def __len__(self) -> int:
        return len(self.array)

    def __getitems__(self, indices: npt.NDArray[np.uint64]) -> npt.NDArray[Any]:
        self.threads.add(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        return self.array[indices]


def _streams() -> dict[str, Any]:
    return {
        "x": Fake(np.arange(N * 3, dtype=np.float32).reshape(N, 3)),
        "y": Fake(np.arange(N, dtype=np.int32)),
    }


def _take(loader: DataLoader, n: int) -> list[dict[str, Any]]:
    return [next(loader) for _ in range(n)]


def _assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stop", [0, 3, 7])
def test_resume_from_state_dict_is_exact(mode: str, stop: int) -> None:
    total = 12
    with DataLoader(_streams(), batch_size=64, sampler=mode, seed=5, num_threads=1) as whole:
        expected = _take(whole, total)
    with DataLoader(_streams(), batch_size=64, sampler=mode, seed=5, num_threads=1) as first:
        head = _take(first, stop)
        assert first.step == stop
        state = json.loads(json.dumps(first.state_dict()))
    with DataLoader(
        _streams(), batch_size=64, sampler=mode, seed=5, num_threads=3, prefetch=2
    ) as second:
        second.load_state_dict(state)
        assert second.step == stop
        tail = _take(second, total - stop)
    _assert_same(head + tail, expected)


@pytest.mark.parametrize("mode", MODES)
def test_stream_is_independent_of_threads_and_prefetch(mode: str) -> None:
    runs = []
    for threads, prefetch in [(1, 1), (2, 4), (4, 8)]:
        streams = {"x": Fake(np.arange(N), delay=0.001)}
        with DataLoader(streams, 50, mode, 3, num_threads=threads, prefetch=prefetch) as dl:
            runs.append(_take(dl, 20))
    _assert_same(runs[0], runs[1])
    _assert_same(runs[0], runs[2])


def test_start_step_and_seek_match_the_sampler() -> None:
    streams = {"y": np.arange(N)}
    with DataLoader(streams, batch_size=10, sampler="iid", seed=1, start_step=40) as dl:
        assert dl.step == 40
        a = next(dl)["y"]
        np.testing.assert_array_equal(a, dl.sampler.indices(40))
        dl.seek(5)
        np.testing.assert_array_equal(next(dl)["y"], dl.sampler.indices(5))
        assert dl.step == 6
        np.testing.assert_array_equal(dl.batch_at(40)["y"], a)
        assert dl.step == 6


def test_streams_line_up_and_workers_gather() -> None:
    streams = _streams()
    with DataLoader(streams, batch_size=32, num_threads=2) as dl:
        for batch in _take(dl, 10):
            assert batch["x"].shape == (32, 3) and batch["y"].shape == (32,)
            np.testing.assert_array_equal(batch["x"][:, 0], batch["y"] * 3)
            assert len(np.unique(batch["y"])) == 32  # cyclic: no repeats within a batch
    assert all(name.startswith("chute-loader") for name in streams["x"].threads)


def test_transform_is_the_collate() -> None:
    def collate(batch: dict[str, Any]) -> dict[str, Any]:
        return {"sum": batch["x"].sum(axis=1), "label": batch["y"] + 1}

    with DataLoader(_streams(), batch_size=8, sampler="sequential", transform=collate) as dl:
        batch = next(dl)
    assert set(batch) == {"sum", "label"}
    np.testing.assert_array_equal(batch["label"], np.arange(1, 9))
    np.testing.assert_array_equal(batch["sum"], np.arange(8) * 9 + 3)


def _run_guarded(fn: Any) -> BaseException:
    """Run fn on a thread and return what it raised; fails instead of hanging forever."""
    caught: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            caught.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the error never reached the consumer"
    assert caught, "nothing was raised"
    return caught[0]


def test_transform_error_reaches_next_with_traceback() -> None:
    def explode_at_step_2(batch: dict[str, Any]) -> dict[str, Any]:
        if 40 in batch["y"]:
            raise ZeroDivisionError("bad batch")
        return batch

    streams = {"y": np.arange(N)}
    dl = DataLoader(streams, 20, "sequential", num_threads=2, transform=explode_at_step_2)
    got = _take(dl, 2)
    assert [int(b["y"][0]) for b in got] == [0, 20]
    exc = _run_guarded(lambda: next(dl))
    assert isinstance(exc, ZeroDivisionError)
    frames = traceback.extract_tb(exc.__traceback__)
    assert any(f.name == "explode_at_step_2" for f in frames)
    assert dl.step == 2  # the failed step is not skipped
    dl.transform = None
    assert int(next(dl)["y"][0]) == 40
    dl.close()


def test_gather_error_reaches_next() -> None:
    class Broken(Fake):
        def __getitems__(self, indices: npt.NDArray[np.uint64]) -> npt.NDArray[Any]:
            raise OSError("disk on fire")

    dl = DataLoader({"x": Broken(np.arange(10))}, batch_size=2, num_threads=2)
    exc = _run_guarded(lambda: next(dl))
    assert isinstance(exc, OSError) and "disk on fire" in str(exc)
    dl.close()


def test_close_stops_threads() -> None:
    before = set(threading.enumerate())
    dl = DataLoader({"x": Fake(np.arange(N), delay=0.002)}, batch_size=4, num_threads=3)
    _take(dl, 3)
    dl.close()
    dl.close()  # idempotent
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError, match="closed"):
        next(dl)


def test_interpreter_exit_with_open_loaders_is_clean() -> None:
    code = """
import time, numpy as np
import chute
from chute import DataLoader
class Slow:
    def __len__(self): return 100
    def __getitems__(self, idx):
        time.sleep(0.05)
        return np.asarray(idx)
loaders = [DataLoader({"x": Slow()}, batch_size=4, num_threads=2, prefetch=8) for _ in range(3)]
for dl in loaders:
    next(dl)
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", [2, 4])
def test_shards_partition_the_global_batch(mode: str, count: int) -> None:
    streams = {"y": np.arange(N)}
    with DataLoader(streams, batch_size=64, sampler=mode, seed=2) as whole:
        expected = _take(whole, 5)
    shards = []
    for index in range(count):
        with DataLoader(streams, 64, mode, 2, shard=(index, count)) as dl:
            shards.append([b["y"] for b in _take(dl, 5)])
    for step in range(5):
        parts = [shards[i][step] for i in range(count)]
        assert all(len(p) == 64 // count for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), expected[step]["y"])
        if mode != "iid":
            assert len(np.unique(np.concatenate(parts))) == 64  # disjoint


def test_resume_on_a_different_process_count() -> None:
    streams = {"y": np.arange(N)}
    with DataLoader(streams, 64, "cyclic", 9, shard=(0, 4)) as dl:
        _take(dl, 3)
        state = dl.state_dict()
    resumed = []
    for index in range(2):
        with DataLoader(streams, 64, "cyclic", 9, shard=(index, 2)) as dl:
            dl.load_state_dict(state)
            resumed.append(next(dl)["y"])
    with DataLoader(streams, 64, "cyclic", 9, start_step=3) as dl:
        np.testing.assert_array_equal(np.concatenate(resumed), next(dl)["y"])


def test_auto_shard_asks_the_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_jax = SimpleNamespace(process_index=lambda: 1, process_count=lambda: 4)
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    with DataLoader({"y": np.arange(N)}, batch_size=64, shard="auto") as dl:
        assert dl.shard == (1, 4)
        assert next(dl)["y"].shape == (16,)
    monkeypatch.delitem(sys.modules, "jax")
    fake_dist = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        get_rank=lambda: 2,
        get_world_size=lambda: 8,
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist)
    with DataLoader({"y": np.arange(N)}, batch_size=64, shard="auto") as dl:
        assert dl.shard == (2, 8)


def test_bad_streams_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        DataLoader({"a": np.arange(10), "b": np.arange(11)})
    with pytest.raises(ValueError, match="'e' is empty"):
        DataLoader({"e": np.arange(0)}, batch_size=1)
    with pytest.raises(ValueError, match="non-empty dict"):
        DataLoader({})
    with pytest.raises(TypeError, match="needs __len__ and a batch __getitems__"):
        DataLoader({"a": [1, 2, 3]})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="without replacement"):
        DataLoader({"a": np.arange(10)}, batch_size=11)
    with pytest.raises(ValueError, match="does not split evenly"):
        DataLoader({"a": np.arange(100)}, batch_size=10, shard=(0, 3))
    with pytest.raises(ValueError, match="shard index"):
        DataLoader({"a": np.arange(100)}, batch_size=10, shard=(2, 2))
    with pytest.raises(ValueError, match="prefetch"):
        DataLoader({"a": np.arange(100)}, batch_size=10, prefetch=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        DataLoader({"a": np.arange(100)}, batch_size=10, sampler="random")  # type: ignore[arg-type]


def test_foreign_state_is_refused() -> None:
    with DataLoader({"a": np.arange(100)}, batch_size=10, seed=1) as dl:
        state = dl.state_dict()
    with DataLoader({"a": np.arange(100)}, batch_size=10, seed=2) as other:
        with pytest.raises(ValueError, match="seed: saved 1, loader 2"):
            other.load_state_dict(state)
        with pytest.raises(ValueError, match="not a chute DataLoader state"):
            other.load_state_dict({"step": 3})
        assert other.step == 0


@pytest.mark.parametrize("where", ["local", "s3"])
def test_interpreter_exit_with_open_stores_mid_gather(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    import chute
    from tests.objects.remote import to_s3

    chute.write_dataset(tmp_path / "x.zr", np.arange(4000 * 64, dtype=np.int64).reshape(4000, 64))
    chute.write_ragged(tmp_path / "r.zr", [np.arange(i % 50) for i in range(4000)]).close()
    x, r, options = str(tmp_path / "x.zr"), str(tmp_path / "r.zr"), {}
    if where == "s3":  # the same data read by URL: requests in flight at exit
        endpoint = request.getfixturevalue("s3_server")
        (x, options), (r, _) = to_s3(x, endpoint), to_s3(r, endpoint)
    code = f"""
import chute
x = chute.Dataset({x!r}, **{options!r})
r = chute.RaggedDataset({r!r}, **{options!r})
dl = chute.DataLoader({{"x": x, "r": r}}, batch_size=512, num_threads=4, prefetch=16)
next(dl)
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    stops=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    threads=st.integers(1, 4),
    prefetch=st.integers(1, 6),
    seed=st.integers(0, 2**64 - 1),
)
def test_any_chain_of_resumes_replays_the_stream(
    mode: str, stops: list[int], threads: int, prefetch: int, seed: int
) -> None:
    streams = {"y": np.arange(97)}
    with DataLoader(streams, 8, mode, seed, num_threads=1) as dl:  # type: ignore[arg-type]
        expected = [b["y"] for b in _take(dl, sum(stops) + 3)]
    got: list[np.ndarray] = []
    state = None
    for stop in [*stops, 3]:
        loader = DataLoader(streams, 8, mode, seed, num_threads=threads, prefetch=prefetch)  # type: ignore[arg-type]
        with loader as dl:
            if state is not None:
                dl.load_state_dict(state)
            got += [b["y"] for b in _take(dl, stop)]
            state = json.loads(json.dumps(dl.state_dict()))
    np.testing.assert_array_equal(np.stack(got), np.stack(expected))


def test_moving_the_sampler_directly_is_followed() -> None:
    with DataLoader({"y": np.arange(N)}, batch_size=10, sampler="sequential") as dl:
        next(dl)
        dl.sampler.seek(7)
        assert int(next(dl)["y"][0]) == 70


def test_training_loop_example_resumes_exactly() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "train_resume.py"
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "40 steps identical" in proc.stdout


def test_huge_prefetch_is_refused_not_a_hang() -> None:
    code = """
import numpy as np
import chute
from chute import DataLoader
try:
    DataLoader({"x": np.arange(100)}, batch_size=10, prefetch=10**7)
except ValueError as e:
    print("refused:", e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "refused: prefetch must be in [1, 256]" in proc.stdout
    assert "held in memory" in proc.stdout
    with DataLoader({"x": np.arange(100)}, batch_size=10, prefetch=256, num_threads=2) as dl:
        assert next(dl)["x"].shape == (10,)  # the maximum itself works
    for bad in (2.5, "4", True):
        with pytest.raises(TypeError, match="prefetch must be an int"):
            DataLoader({"x": np.arange(100)}, batch_size=10, prefetch=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads must be in"):
        DataLoader({"x": np.arange(100)}, batch_size=10, num_threads=10**6)


@pytest.mark.parametrize("step", [3.9, "7", True, None, 3.0, [3]])
def test_load_state_dict_refuses_a_step_that_is_not_an_int(step: Any) -> None:
    with DataLoader({"a": np.arange(100)}, batch_size=10) as dl:
        state = {**dl.state_dict(), "step": step}
        with pytest.raises(TypeError, match="saved step must be an int"):
            dl.load_state_dict(state)
        with pytest.raises(ValueError, match="saved step must be in"):
            dl.load_state_dict({**state, "step": -1})
        assert dl.step == 0
        dl.load_state_dict({**state, "step": np.int64(7)})
        assert dl.step == 7


def test_a_version_1_state_still_loads() -> None:
    with DataLoader({"a": np.arange(100)}, batch_size=10, seed=4) as dl:
        old = {"version": 1, "step": 12, "seed": 4, "sampler": "cyclic", "batch_size": 10,
               "length": 100}  # fmt: skip
        dl.load_state_dict(old)
        assert dl.step == 12


class Every3rd:
    """A user's sampler written against the protocol only (no chute base class)."""

    def __init__(self, length: int, batch_size: int) -> None:
        self.length, self.batch_size, self.step = length, batch_size, 0

    def seek(self, step: int) -> None:
        self.step = step

    def indices(self, step: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        stop = self.batch_size if stop is None else stop
        pos = np.arange(step * self.batch_size + start, step * self.batch_size + stop)
        return (pos * 3 % self.length).astype(np.uint64)


def test_a_protocol_sampler_object_drives_the_loader() -> None:
    sampler = Every3rd(N, 8)
    with DataLoader({"y": np.arange(N)}, sampler=sampler, num_threads=2) as dl:
        assert dl.batch_size == 8
        got = _take(dl, 3)
        np.testing.assert_array_equal(got[2]["y"], np.arange(16, 24) * 3)
        state = dl.state_dict()
        assert state["sampler"] == "Every3rd" and state["seed"] is None
    with DataLoader({"y": np.arange(N)}, sampler=Every3rd(N, 8), shard=(1, 2)) as dl:
        dl.load_state_dict(state)
        np.testing.assert_array_equal(next(dl)["y"], np.arange(28, 32) * 3)


def test_a_step_sampler_subclass_and_its_fingerprint() -> None:
    class Reversed(chute.StepSampler):
        def fill(self, step: int, start: int, out: np.ndarray) -> None:
            first = step * self.batch_size + start
            out[:] = self.length - 1 - (np.arange(first, first + len(out)) % self.length)

    with DataLoader({"y": np.arange(10)}, sampler=Reversed(10, 4, seed=3)) as dl:
        assert next(dl)["y"].tolist() == [9, 8, 7, 6]
        assert dl.state_dict()["seed"] == 3
        assert (
            dl.state_dict()["sampler"]
            == "test_a_step_sampler_subclass_and_its_fingerprint.<locals>.Reversed"
        )


def test_sampler_objects_are_checked() -> None:
    streams = {"y": np.arange(N)}
    with pytest.raises(TypeError, match="sampler= takes"):
        DataLoader(streams, sampler=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="differs from the sampler's batch_size"):
        DataLoader(streams, batch_size=16, sampler=Every3rd(N, 8))
    with pytest.raises(TypeError, match="seed= goes to the sampler object"):
        DataLoader(streams, sampler=Every3rd(N, 8), seed=1)
    with pytest.raises(ValueError, match="draws from 50 positions, the loader has 1000"):
        DataLoader(streams, sampler=Every3rd(50, 8))
    with pytest.raises(ValueError, match="loaderx's mode codes"):
        DataLoader(streams, 4, 1)  # type: ignore[arg-type]


def test_weighted_sampler_in_a_loader_resumes_exactly() -> None:
    weights = np.linspace(0, 1, N)
    streams = {"y": np.arange(N)}

    def loader(**kw: Any) -> DataLoader:
        return DataLoader(streams, sampler=chute.WeightedSampler(weights, 32, seed=9), **kw)

    with loader(num_threads=1) as dl:
        expected = _take(dl, 10)
    got: list[dict[str, Any]] = []
    state = None
    for stop, threads in [(3, 2), (4, 3), (3, 1)]:
        with loader(num_threads=threads, prefetch=3) as dl:
            if state is not None:
                dl.load_state_dict(state)
            got += _take(dl, stop)
            state = json.loads(json.dumps(dl.state_dict()))
    _assert_same(got, expected)
    other = chute.WeightedSampler(weights[::-1].copy(), 32, seed=9)
    with (
        DataLoader(streams, sampler=other) as dl,
        pytest.raises(ValueError, match="sampler: saved"),
    ):
        dl.load_state_dict(state)


def test_loaderx_argument_names_warn_and_work() -> None:
    streams = {"y": np.arange(N)}
    with pytest.warns(
        DeprecationWarning, match="num_workers= is loaderx's name; chute spells it num_threads="
    ):
        dl = DataLoader(streams, batch_size=8, num_workers=2)
    assert dl.num_threads == 2
    dl.close()
    with pytest.warns(
        DeprecationWarning, match="prefetch_size= is loaderx's name; chute spells it prefetch="
    ):
        dl = DataLoader(streams, batch_size=8, prefetch_size=3)
    assert dl.prefetch == 3
    dl.close()
    for code, name in [(0, "sequential"), (1, "iid"), (2, "cyclic")]:
        with pytest.warns(DeprecationWarning, match=f"chute spells it sampler='{name}'"):
            dl = DataLoader(streams, batch_size=8, mode=code, seed=42)
        assert isinstance(dl.sampler, chute.Sampler) and dl.sampler.mode == name
        with DataLoader(streams, batch_size=8, sampler=name, seed=42) as same:
            np.testing.assert_array_equal(next(dl)["y"], next(same)["y"])
        dl.close()
    with pytest.raises(ValueError, match="loaderx's mode codes are 0, 1 and 2"):
        DataLoader(streams, batch_size=8, mode=5)
    with pytest.raises(TypeError, match=r"both num_workers= .* and num_threads="):
        DataLoader(streams, batch_size=8, num_workers=2, num_threads=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'prefetch_factor'"):
        DataLoader(streams, batch_size=8, prefetch_factor=2)
    with pytest.warns(DeprecationWarning, match="spells it sampler='iid'"):
        s = chute.Sampler(100, 4, 1)  # type: ignore[arg-type]
    assert s.mode == "iid"
