"""ShardWindowSampler and DataLoader(sampler="window"): pure in (seed, step), every record once
per cycle, a window's records from its shards alone, and resume exactly where it stopped."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import DataLoader, ShardWindowSampler
from chute._native import fill_window
from chute.errors import StateMismatchError
from tests.objects.remote import Serve

from ..store.isolate import OK, UNEXPECTED, run_isolated
from ..util.test_state import Case, check_resumes, take_next

LENGTHS = [7, 0, 12, 5, 9, 3, 11, 0, 6, 8, 4]  # uneven, two of them empty: 65 records


def _starts(lengths: Any) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64))])


def _shard_of(lengths: Any, records: np.ndarray) -> np.ndarray:
    """The shard each record index lies in (an empty shard holds none)."""
    return np.searchsorted(_starts(lengths)[:-1], records.astype(np.int64), side="right") - 1


def _cycle(s: ShardWindowSampler, cycle: int) -> np.ndarray:
    """The records of one cycle, in the order its batches draw them."""
    per = s.steps_per_cycle
    return np.concatenate([s.indices(cycle * per + k) for k in range(per)]).astype(np.int64)


def _check_cycle(s: ShardWindowSampler, cycle: int) -> None:
    """The cycle runs through its windows in order: the stream's stretch of window w holds
    records of w's shards only, all of them once for every window the batches cover."""
    lengths = s.shard_lengths.astype(np.int64)
    order = s.shard_order(cycle).astype(np.int64)
    assert sorted(order.tolist()) == list(range(lengths.size))
    stream = _cycle(s, cycle)
    assert stream.size == s.steps_per_cycle * s.batch_size == len(set(stream.tolist()))
    starts = _starts(lengths)
    at = 0
    for w in range(0, order.size, s.window):
        shards = order[w : w + s.window]
        records = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in shards])
        part = stream[at : at + records.size]
        assert set(_shard_of(lengths, part).tolist()) <= set(shards.tolist()), (cycle, w)
        if at + records.size <= stream.size:
            assert sorted(part.tolist()) == sorted(records.tolist()), (cycle, w)
        at += records.size


# -- the stream -----------------------------------------------------------------------------


def test_a_batch_is_a_pure_function_of_seed_and_step() -> None:
    a = ShardWindowSampler(LENGTHS, 8, window=3, seed=5)
    stream = [next(a) for _ in range(40)]  # five cycles of 8 steps
    assert all(x.dtype == np.uint64 and x.shape == (8,) for x in stream)
    for step in (39, 0, 17, 8, 23):
        fresh = ShardWindowSampler(LENGTHS, 8, window=3, seed=5)
        np.testing.assert_array_equal(fresh.indices(step), stream[step])
        fresh.seek(step)
        np.testing.assert_array_equal(next(fresh), stream[step])
    other = ShardWindowSampler(LENGTHS, 8, window=3, seed=6)
    assert any(not np.array_equal(other.indices(k), stream[k]) for k in range(8))


@pytest.mark.parametrize("step", [10**15, 2**64 - 1])
def test_seek_far_costs_nothing_and_draws_a_whole_cycle(step: int) -> None:
    s = ShardWindowSampler(LENGTHS, 5, window=2, seed=1)
    s.seek(step)
    far = next(s)
    np.testing.assert_array_equal(
        far, ShardWindowSampler(LENGTHS, 5, window=2, seed=1).indices(step)
    )
    assert far.max() < 65
    cycle = step // s.steps_per_cycle
    if (cycle + 1) * s.steps_per_cycle <= 2**64:  # the last cycle of the step counter is cut
        _check_cycle(s, cycle)


@pytest.mark.parametrize("window", [1, 2, 3, 4, 11, 50])
@pytest.mark.parametrize("batch", [1, 5, 13, 65])
def test_every_record_once_per_cycle_a_window_at_a_time(window: int, batch: int) -> None:
    s = ShardWindowSampler(LENGTHS, batch, window=window, seed=3)
    for cycle in (0, 1, 7):
        _check_cycle(s, cycle)
    if 65 % batch == 0:
        assert sorted(_cycle(s, 0).tolist()) == list(range(65))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=25).filter(lambda x: sum(x) > 0),
    window=st.integers(1, 9),
    batch_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**64 - 1),
    cycle=st.one_of(st.integers(0, 3), st.integers(0, 2**40)),
)
def test_any_layout_draws_its_windows_in_turn(
    lengths: list[int], window: int, batch_frac: float, seed: int, cycle: int
) -> None:
    batch = max(1, int(batch_frac * sum(lengths)))
    _check_cycle(ShardWindowSampler(lengths, batch, window=window, seed=seed), cycle)


def test_cycles_and_seeds_order_the_shards_differently() -> None:
    s = ShardWindowSampler([50] * 100, 64, window=4, seed=0)
    orders = {tuple(s.shard_order(c).tolist()) for c in range(20)}
    assert len(orders) == 20
    assert all(sorted(o) == list(range(100)) for o in orders)
    t = ShardWindowSampler([50] * 100, 64, window=4, seed=1)
    assert not np.array_equal(s.shard_order(0), t.shard_order(0))
    # the first window is other shards from cycle to cycle: windows regroup, not just reorder
    firsts = {frozenset(s.shard_order(c)[:4].tolist()) for c in range(20)}
    assert len(firsts) == 20


def test_a_batch_needs_one_window_or_two_at_a_boundary() -> None:
    lengths = [100] * 40
    for window, batch in [(1, 64), (2, 64), (4, 256), (4, 300)]:
        s = ShardWindowSampler(lengths, batch, window=window, seed=2)
        spans = []
        for step in range(3 * s.steps_per_cycle):
            cycle = step // s.steps_per_cycle
            place = np.argsort(s.shard_order(cycle))  # the place of each shard in the order
            windows = set((place[_shard_of(lengths, s.indices(step))] // window).tolist())
            assert len(windows) <= 2 and max(windows) - min(windows) <= 1, (window, step)
            spans.append(len(windows))
        assert 1 in spans and 2 in spans


def test_slices_concatenate_to_the_batch() -> None:
    s = ShardWindowSampler(LENGTHS, 20, window=2, seed=9)
    for step in (0, 1, 2, 5, 10**9):
        whole = s.indices(step)
        for cuts in ([0, 20], [0, 10, 20], [0, 1, 7, 7, 19, 20], list(range(21))):
            parts = [s.indices(step, a, b) for a, b in itertools.pairwise(cuts)]
            np.testing.assert_array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="outside a batch"):
        s.indices(0, 15, 21)


def test_the_stream_is_that_of_earlier_versions() -> None:
    """A saved state resumes the same batches in a later chute."""
    s = ShardWindowSampler(LENGTHS, 8, window=3, seed=11)
    assert s.indices(0).tolist() == FIRST_BATCH
    draws = np.concatenate([s.indices(step) for step in range(500)])
    assert hashlib.sha256(draws.tobytes()).hexdigest()[:16] == STREAM_DIGEST
    assert s.fingerprint() == {"kind": "window", "window": 3, "shards": SHARDS_DIGEST}


FIRST_BATCH = [4, 6, 2, 48, 49, 47, 51, 5]
STREAM_DIGEST = "52dc7579e68588be"
SHARDS_DIGEST = "3c78dd13ad3f2cd0"


# -- the loader -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("window") / "images"
    chute.write_dataset(path, np.arange(103 * 2, dtype=np.int32).reshape(103, 2), shard_records=10)
    return path


def _loader(path: Path, serve: Serve | None = None, **kw: Any) -> DataLoader:
    """The window loader over the dataset at ``path``, read as ``serve`` reads it."""
    ds = chute.Dataset(path) if serve is None else serve.open(chute.Dataset, path)
    return DataLoader({"x": ds}, **{"sampler": "window", **kw})


def test_a_sharded_dataset_tells_its_shard_lengths(sharded: Path, tmp_path: Path) -> None:
    with chute.Dataset(sharded) as ds:
        assert ds.shard_lengths is not None
        assert ds.shard_lengths.tolist() == [10] * 10 + [3]
    ragged = chute.write_ragged(tmp_path / "r", [np.arange(i) for i in range(7)], shard_records=3)
    assert ragged.shard_lengths is not None and ragged.shard_lengths.tolist() == [3, 3, 1]
    ragged.close()
    with chute.write_dataset(tmp_path / "one", np.arange(5)) as one:
        assert one.shard_lengths is None


def test_the_loader_draws_the_window_stream_from_the_shards(sharded: Path, serve: Serve) -> None:
    ds = serve.open(chute.Dataset, sharded)
    expected = ShardWindowSampler(ds.shard_lengths, 16, window=2, seed=4)
    streams = {"x": ds, "i": np.arange(103)}
    kw = {"window": 2, "seed": 4, "num_threads": 3, "prefetch": 8}
    with DataLoader(streams, batch_size=16, sampler="window", **kw) as loader:
        assert isinstance(loader.sampler, ShardWindowSampler)
        for step in range(3 * expected.steps_per_cycle + 1):  # across cycle boundaries
            batch = next(loader)
            np.testing.assert_array_equal(batch["i"], expected.indices(step))
            np.testing.assert_array_equal(batch["x"][:, 0], batch["i"] * 2)
    with DataLoader({"x": ds}, batch_size=10, sampler="window") as loader:  # window=4, seed=0
        assert loader.sampler.fingerprint()["window"] == 4
        np.testing.assert_array_equal(
            next(loader)["x"][:, 0] // 2, ShardWindowSampler(ds.shard_lengths, 10).indices(0)
        )
    ds.close()


def test_each_host_draws_its_slice(sharded: Path, serve: Serve) -> None:
    def stream(shard: tuple[int, int]) -> list[np.ndarray]:
        with _loader(sharded, serve, batch_size=12, window=3, seed=1, shard=shard) as loader:
            return [next(loader)["x"] for _ in range(20)]

    whole = stream((0, 1))
    hosts = [stream((i, 3)) for i in range(3)]
    for step in range(20):
        np.testing.assert_array_equal(np.concatenate([h[step] for h in hosts]), whole[step])


def test_state_resumes_the_uninterrupted_stream(sharded: Path, serve: Serve) -> None:
    def sampler() -> ShardWindowSampler:
        return ShardWindowSampler([10] * 10 + [3], 12, window=3, seed=1)

    cases = [
        Case(lambda: ShardWindowSampler(LENGTHS, 8, window=3, seed=7), take_next, 8),
        Case(
            lambda: _loader(
                sharded, serve, batch_size=8, window=2, seed=3, num_threads=2, prefetch=3
            ),
            take_next,
            103 // 8,
        ),
        Case(
            lambda: _loader(sharded, serve, sampler=sampler(), shard=(1, 2)), take_next, 103 // 12
        ),
    ]
    for case in cases:
        check_resumes(case)


def test_a_state_of_another_window_or_grouping_is_refused(sharded: Path) -> None:
    with _loader(sharded, batch_size=8, window=2) as loader:
        next(loader)
        state = json.loads(json.dumps(loader.state_dict()))
    with (
        _loader(sharded, batch_size=8, window=3) as other,
        pytest.raises(StateMismatchError, match="sampler"),
    ):
        other.load_state_dict(state)
    saved = ShardWindowSampler([10] * 10 + [3], 8, window=2).state_dict()
    regrouped = ShardWindowSampler([3] + [10] * 10, 8, window=2)  # same length, other shards
    with pytest.raises(StateMismatchError, match="sampler"):
        regrouped.load_state_dict(saved)
    with pytest.raises(StateMismatchError, match="sampler"):
        chute.Sampler(103, 8, "cyclic").load_state_dict(saved)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "kw", "error", "match"),
    [
        ([], {}, ValueError, "empty"),
        ([0, 0], {}, ValueError, "no records"),
        ([3, -1], {}, ValueError, r"shard_lengths\[1\] is -1"),
        ([2.0, 3.0], {}, TypeError, "ints"),
        ([True, False], {}, TypeError, "ints"),
        ([[1, 2]], {}, TypeError, "1-D"),
        ("abc", {}, TypeError, "ints"),
        ([2**63, 2**63], {}, ValueError, "2\\*\\*64"),
        ([2**64], {}, ValueError, r"shard_lengths\[0\]"),
        ([4, 4], {"window": 0}, ValueError, "window must be a positive int"),
        ([4, 4], {"window": True}, TypeError, "window must be an int"),
        ([4, 4], {"window": 2.0}, TypeError, "window must be an int"),
        ([4, 4], {"seed": -1}, ValueError, "seed"),
        ([4, 4], {"batch_size": 9}, ValueError, "without replacement"),
        ([4, 4], {"batch_size": 0}, ValueError, "batch_size"),
    ],
)
def test_bad_arguments_are_clear_errors(
    lengths: Any, kw: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ShardWindowSampler(lengths, kw.pop("batch_size", 2), **kw)


def test_options_are_keywords_and_a_misspelt_one_names_the_nearest() -> None:
    with pytest.raises(TypeError, match="did you mean 'window'"):
        ShardWindowSampler([4, 4], 2, windw=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        ShardWindowSampler([4, 4], 2, 2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="did you mean 'window'"):
        DataLoader({"x": np.arange(8)}, 2, sampler="window", windows=2)


def test_numpy_integers_are_taken() -> None:
    s = ShardWindowSampler(np.array([3, 5], np.uint16), np.int64(4), window=np.int8(1))
    assert (s.length, s.batch_size, s.window) == (8, 4, 1)
    assert ShardWindowSampler(np.array([2**63, 1], dtype=object), 1).length == 2**63 + 1


def test_the_loader_says_what_the_window_mode_needs(sharded: Path, tmp_path: Path) -> None:
    ds = chute.Dataset(sharded)
    with pytest.raises(ValueError, match="no shards"):
        DataLoader({"x": np.arange(103)}, sampler="window")
    with chute.write_dataset(tmp_path / "one", np.arange(103)) as one:
        with pytest.raises(ValueError, match="no shards"):
            DataLoader({"x": one}, sampler="window")
        with DataLoader({"x": ds, "y": one}, batch_size=4, sampler="window") as loader:
            assert isinstance(loader.sampler, ShardWindowSampler)  # the sharded stream's shards
    regrouped = chute.write_dataset(tmp_path / "other", np.arange(103), shard_records=20)
    with pytest.raises(ValueError, match="sharded differently"):
        DataLoader({"x": ds, "y": regrouped}, sampler="window")
    regrouped.close()
    with pytest.raises(TypeError, match="window= is the shard-window sampler's"):
        DataLoader({"x": ds}, sampler="cyclic", window=2)
    with pytest.raises(ValueError, match="indices="):
        DataLoader({"x": ds}, sampler="window", indices=np.arange(50))
    with pytest.raises(ValueError, match="window must be a positive int"):
        DataLoader({"x": ds}, sampler="window", window=0)
    with pytest.raises(ValueError, match="draws from 100 positions, the loader has 103"):
        DataLoader({"x": ds}, sampler=ShardWindowSampler([10] * 10, 4))
    ds.close()


def test_the_compiled_window_fill_refuses_bad_buffers_without_a_crash() -> None:
    """Every buffer and position is checked; tables that are wrong but well-formed give
    wrong positions, never a read outside them."""

    def child() -> int:
        u = np.uint64
        begins, shift, out = np.array([10, 14, 20], u), np.array([0, 5], u), np.empty(4, u)
        fill_window(begins, shift, 1, 2, 0, out)  # the valid call
        bad: list[tuple[Any, ...]] = [
            (begins, shift[:0], 1, 2, 0, out),  # no shard
            (begins[:2], shift, 1, 2, 0, out),  # begins of the wrong size
            (np.array([10, 14, 10], u), shift, 1, 2, 0, out),  # no records
            (begins, shift, 1, 2, 7, out),  # past the window's 10 records
            (begins, shift, 1, 2, 11, out[:0]),
            (begins, shift, 1, 2, 2**64 - 1, out),
            (begins, shift, -1, 2, 0, out),
            (begins, shift, 1, 2**64, 0, out),
            (begins, shift, 1, 2, 0, np.empty(4, u)[::2]),  # not contiguous
            (begins, shift, 1, 2, 0, np.frombuffer(bytearray(33), u, 4, offset=1)),  # unaligned
            (begins, shift, 1, 2, 0, np.empty(3, np.uint8)),  # not whole uint64s
            (begins, shift, 1, 2, 0, "out"),
            (begins, shift, 1, 2, 0),
        ]
        ro = np.empty(4, u)
        ro.flags.writeable = False
        bad.append((begins, shift, 1, 2, 0, ro))
        refused = 0
        for args in bad:
            try:
                fill_window(*args)
            except (ValueError, TypeError, OverflowError, BufferError):
                refused += 1
        if refused != len(bad):
            return UNEXPECTED
        # garbage tables: decreasing begins, out aliasing the tables; in bounds all the same
        junk = np.array([5, 2**64 - 1, 3, 9], u)
        fill_window(junk, np.array([1, 2, 3], u), 7, 7, 0, np.empty(4, u))
        alias = np.array([0, 8, 16, 1, 2], u)
        fill_window(alias[:3], alias[3:], 7, 7, 0, alias[:3])
        return OK

    assert run_isolated(child) == OK
