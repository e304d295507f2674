"""Weighted mixtures: shares at every prefix, each source's own order, schedules, exact resume
on any process count, and no threads per source."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chute import DataLoader, Mixture, TokenWindows, mix, write_tokens
from chute.loader import MixSampler


def _sources(lengths: list[int]) -> dict[str, np.ndarray]:
    """Source s holds records ``s * 1_000_000 + i``: a record tells its source and place."""
    return {f"s{s}": s * 1_000_000 + np.arange(n) for s, n in enumerate(lengths)}


def _drawn(mixture: Mixture, positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(mixture.offsets, positions.astype(np.int64), side="right") - 1


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12).filter(lambda w: sum(w) > 0),
    batch=st.integers(1, 64),
    seed=st.integers(0, 2**64 - 1),
)
def test_every_prefix_is_within_a_few_records_of_the_weights(
    weights: list[float], batch: int, seed: int
) -> None:
    mixture = mix(_sources([7] * len(weights)), weights)
    sampler = mixture.sampler(batch, seed)
    share = np.asarray(weights) / sum(weights)
    depth = int(np.ceil(np.log2(len(weights)))) if len(weights) > 1 else 0
    counts = np.zeros(len(weights))
    for step in range(60):
        counts += np.bincount(_drawn(mixture, sampler.indices(step)), minlength=len(weights))
        error = np.abs(counts - share * batch * (step + 1))
        assert error.max() <= depth + 1e-6  # within a record per level of the tree
        assert list(sampler.drawn(batch * (step + 1)).values()) == counts.tolist()
    assert (counts[share == 0] == 0).all()


def test_far_steps_cost_the_same_and_agree_with_counting() -> None:
    mixture = mix(_sources([11, 13, 17]), [0.5, 0.3, 0.2])
    sampler = mixture.sampler(32, seed=9)
    far = 10**15
    counts = sampler.drawn(32 * far)
    assert abs(counts["s0"] - 0.5 * 32 * far) <= 2
    batch = sampler.indices(far)
    source = _drawn(mixture, batch)
    after = sampler.drawn(32 * (far + 1))
    assert [after[f"s{s}"] - counts[f"s{s}"] for s in range(3)] == np.bincount(
        source, minlength=3
    ).tolist()


def test_each_source_cycles_through_its_own_permutation() -> None:
    lengths = [10, 37, 5]
    mixture = mix(_sources(lengths), [1, 1, 1])
    sampler = mixture.sampler(6, seed=4)
    per_source: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for step in range(200):
        positions = sampler.indices(step).astype(np.int64)
        for p, s in zip(positions, _drawn(mixture, positions), strict=True):
            per_source[int(s)].append(int(p - mixture.offsets[s]))
    for s, n in enumerate(lengths):
        drawn = per_source[s]
        passes = [drawn[k : k + n] for k in range(0, len(drawn) - n + 1, n)]
        assert all(sorted(p) == list(range(n)) for p in passes)
        assert len({tuple(p) for p in passes}) > 1  # a fresh order each pass


def test_sequential_and_iid_sources() -> None:
    mixture = mix(_sources([4, 4]), [1, 1])
    sequential = mixture.sampler(4, mode="sequential")
    got = [int(p) for step in range(4) for p in sequential.indices(step)]
    assert sorted(p for p in got if p < 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    iid = mixture.sampler(4, seed=1, mode="iid")
    assert np.array_equal(iid.indices(3), mixture.sampler(4, seed=1, mode="iid").indices(3))
    with pytest.raises(ValueError, match="'cyclic', 'sequential' or 'iid'"):
        mixture.sampler(4, mode="window")  # type: ignore[arg-type]


def test_a_schedule_changes_the_weights_from_its_step() -> None:
    mixture = mix(_sources([50, 50]), {"s0": 1, "s1": 0}, schedule={10: {"s0": 1, "s1": 3}})
    sampler = mixture.sampler(8, seed=0)
    early = np.concatenate([sampler.indices(t) for t in range(10)])
    late = np.concatenate([sampler.indices(t) for t in range(10, 30)])
    assert (_drawn(mixture, early) == 0).all()
    assert np.bincount(_drawn(mixture, late), minlength=2).tolist() == [40, 120]
    assert mixture.weights_at(9) == {"s0": 1.0, "s1": 0.0}
    assert mixture.weights_at(10) == {"s0": 0.25, "s1": 0.75}
    assert sampler.drawn(8 * 30) == {"s0": 120, "s1": 120}


def test_the_loader_resumes_a_mixture_exactly_on_any_process_count() -> None:
    mixture = mix(_sources([23, 41, 7]), {"s0": 0.5, "s1": 0.3, "s2": 0.2},
                  schedule={6: [0.2, 0.2, 0.6]})  # fmt: skip

    def make(shard: tuple[int, int] | None = None) -> DataLoader:
        return DataLoader({"x": mixture}, batch_size=12, seed=7, shard=shard)

    with make() as loader:
        whole = [next(loader)["x"] for _ in range(14)]
    for stop in (2, 6, 9):
        with make() as first:
            for _ in range(stop):
                next(first)
            state = first.state_dict()
        for count in (1, 2, 3, 4):
            parts = []
            for index in range(count):
                with make((index, count)) as part:
                    part.load_state_dict(state)
                    parts.append([next(part)["x"] for _ in range(14 - stop)])
            joined = [np.concatenate([p[s] for p in parts]) for s in range(14 - stop)]
            assert all(np.array_equal(a, b) for a, b in zip(joined, whole[stop:], strict=True))


def test_a_mixture_of_token_windows(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    streams = {}
    for name, n in (("web", 300), ("code", 40), ("math", 90)):
        docs = [rng.integers(0, 999, int(rng.integers(5, 80))).astype(np.uint16) for _ in range(n)]
        streams[name] = TokenWindows(write_tokens(tmp_path / name, docs), seq_len=32)
    mixture = mix(streams, {"web": 0.6, "code": 0.3, "math": 0.1})
    with DataLoader(mixture, batch_size=20, seed=1) as loader:
        batch = next(loader)
        state = loader.state_dict()
        after = next(loader)
    assert set(batch) == {"tokens", "source"} and batch["tokens"].shape == (20, 33)
    assert np.bincount(batch["source"], minlength=3).tolist() == [12, 6, 2]
    with DataLoader(mixture, batch_size=20, seed=1) as again:
        again.load_state_dict(state)
        assert np.array_equal(next(again)["tokens"], after["tokens"])
    for ds in streams.values():
        ds.tokens.close()


def test_threads_do_not_grow_with_the_sources() -> None:
    def threads_for(n: int) -> int:
        mixture = mix(_sources([5] * n), [1] * n)
        with DataLoader({"x": mixture}, batch_size=16, num_threads=2) as loader:
            for _ in range(5):
                next(loader)
            return threading.active_count()

    assert threads_for(40) == threads_for(1)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (({"a": np.arange(3)}, {"a": 1, "b": 1}), ValueError, "one weight per source"),
        (({"a": np.arange(3)}, [1, 2]), ValueError, "2 weights for 1 sources"),
        (({"a": np.arange(3)}, [0]), ValueError, "not all 0"),
        (({"a": np.arange(3)}, [float("nan")]), ValueError, "finite"),
        (({}, []), ValueError, "non-empty"),
        (({"a": np.arange(3)}, [1], {0: [1]}), ValueError, "schedule step"),
        (({"a": np.arange(3), "b": np.arange(3)}, {1, 2}), TypeError, "not a set"),
        (({"a": np.arange(3)}, 1), TypeError, "not a int"),
        (({"a": np.arange(3), "b": np.arange(3)}, ["1", "2"]), TypeError, "must be numbers"),
        (({"a": np.arange(3)}, [True]), TypeError, "must be numbers"),
    ],
)
def test_bad_mixtures_are_refused(args: tuple, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        mix(args[0], args[1], schedule=args[2] if len(args) > 2 else None)


def test_weights_of_any_scale_share_alike() -> None:
    """Weights are relative: scaled up to near the float limit (their sum past it) or down,
    they share the records out the same way."""
    sources = {"a": np.arange(100), "b": np.arange(100), "c": np.arange(100)}
    for scale in (1.0, 1e-300, 1e308):
        mixture = mix(sources, [1.5 * scale, 0.5 * scale, 1.0 * scale])
        assert mixture.weights_at(0) == pytest.approx({"a": 0.5, "b": 1 / 6, "c": 1 / 3})


def test_sources_must_gather_alike() -> None:
    mixture = mix({"a": np.zeros((5, 2)), "b": np.zeros((5, 3))}, [1, 1])
    with (
        DataLoader({"x": mixture}, batch_size=4) as loader,
        pytest.raises(TypeError, match="different shapes"),
    ):
        next(loader)
    with pytest.raises(ValueError, match="one mixture"):
        DataLoader({"x": mixture, "y": mixture}, batch_size=4)
    with pytest.raises(ValueError, match="indices= restricts"):
        DataLoader({"x": mixture}, batch_size=4, indices=[0, 1])
    assert isinstance(mixture.sampler(4), MixSampler)


def test_the_mixture_opens_no_files_of_its_own(tmp_path: Path) -> None:
    import os

    from chute import TokenDataset

    for i in range(12):
        write_tokens(tmp_path / str(i), [np.arange(300) % 97], dtype=np.uint16).close()
    datasets = [TokenDataset(tmp_path / str(i)) for i in range(12)]
    here = os.path.realpath(tmp_path) + os.sep

    def files_here() -> list[str]:  # collecting earlier tests' objects closes files elsewhere
        links = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return sorted(x for x in links if x.startswith(here))

    opened = files_here()
    mixture = mix({str(i): TokenWindows(ds, 16) for i, ds in enumerate(datasets)}, [1] * 12)
    with DataLoader(mixture, batch_size=24, num_threads=2) as loader:
        for _ in range(30):
            next(loader)
        assert files_here() == opened
    for ds in datasets:
        ds.close()


def test_a_mixture_in_worker_processes_is_the_same(tmp_path: Path) -> None:
    from chute import PackedTokens

    rng = np.random.default_rng(1)
    sources = {}
    for name in ("a", "b"):
        docs = [rng.integers(0, 999, int(rng.integers(5, 90))).astype(np.uint16) for _ in range(60)]
        sources[name] = PackedTokens(write_tokens(tmp_path / name, docs), 24, group=4, lanes=4)
    mixture = mix(sources, [2, 1], schedule={3: [1, 2]})
    runs = []
    for workers in (0, 2):
        with DataLoader(mixture, batch_size=9, seed=4, workers=workers) as loader:
            runs.append([next(loader) for _ in range(6)])
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(*runs, strict=True) for k in x)


@pytest.mark.parametrize("batch", [1, 7, 24, 1000, 9000])
def test_draws_made_a_block_at_a_time_are_the_draws_of_each_step(batch: int) -> None:
    """The sampler draws 8192 records at a time and keeps the blocks: a step's batch is the
    same as drawing that step's records alone, for steps inside a block, straddling two,
    longer than one, across a schedule's phase change, sliced across processes, and from
    several threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    mixture = mix(_sources([11, 300, 17]), [0.5, 0.3, 0.2], schedule={5: [0.1, 0.1, 0.8]})
    steps = [0, 1, 2, 4, 5, 6, 8191 // batch, 8192 // batch + 1, 10**12]
    want = {s: mixture.sampler(batch, seed=3)._positions(s * batch, batch) for s in steps}
    sampler = mixture.sampler(batch, seed=3)
    with ThreadPoolExecutor(4) as pool:
        got = dict(zip(steps, pool.map(sampler.indices, steps), strict=True))
    for s in steps:
        assert np.array_equal(got[s], want[s]), s
        half = batch // 2
        assert np.array_equal(sampler.indices(s, half, batch), want[s][half:])  # a slice of it
