"""Subsets and splits: a loader restricted to some records, resumable exactly."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import DataLoader

N = 503


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5000),
    cuts=st.lists(st.integers(0, 100), min_size=1, max_size=5),
    seed=st.integers(0, 2**64 - 1),
)
def test_split_partitions_the_index_space(n: int, cuts: list[int], seed: int) -> None:
    if sum(cuts) == 0:
        cuts = [1, *cuts]
    fractions = [c / sum(cuts) for c in cuts]
    parts = chute.split(n, fractions, seed)
    assert len(parts) == len(fractions)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(n))  # disjoint and covering
    for part, f in zip(parts, fractions, strict=True):
        assert abs(len(part) - f * n) <= 1
        assert np.all(np.diff(part) > 0)  # sorted
    again = chute.split(n, fractions, seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_split_depends_on_the_seed_and_checks_its_arguments() -> None:
    a, _ = chute.split(1000, [0.9, 0.1], seed=1)
    b, _ = chute.split(1000, [0.9, 0.1], seed=2)
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError, match="add up to 1"):
        chute.split(10, [0.5, 0.4])
    with pytest.raises(ValueError, match="numbers in"):
        chute.split(10, [1.5, -0.5])
    with pytest.raises(ValueError, match="numbers in"):
        chute.split(10, [])
    with pytest.raises(ValueError, match="positive int"):
        chute.split(0, [1.0])
    with pytest.raises(ValueError, match="numbers in"):
        chute.split(10, [True, False])
    sizes = [len(p) for p in chute.split(np.int64(10), np.array([0.3, 0.7], np.float32))]
    assert sizes == [3, 7]


def _streams() -> dict[str, Any]:
    return {"y": np.arange(N), "x": np.arange(N * 2).reshape(N, 2)}


@pytest.mark.parametrize("mode", ["sequential", "iid", "cyclic"])
def test_a_subset_loader_draws_only_members(mode: str) -> None:
    train, _ = chute.split(N, [0.8, 0.2], seed=3)
    with DataLoader(_streams(), 16, mode, 1, indices=train) as dl:  # type: ignore[arg-type]
        batches = [next(dl) for _ in range(60)]
    drawn = np.concatenate([b["y"] for b in batches])
    assert np.isin(drawn, train).all()
    for b in batches:
        np.testing.assert_array_equal(b["x"][:, 0], b["y"] * 2)  # streams still line up
    if mode == "cyclic":  # one cycle visits every member at most once
        per_cycle = len(train) // 16
        first = drawn[: per_cycle * 16]
        assert len(np.unique(first)) == len(first)
        assert dl.sampler.length == len(train)


@pytest.mark.parametrize("mode", ["sequential", "iid", "cyclic"])
def test_resume_across_a_subset_is_exact(mode: str) -> None:
    members = chute.split(N, [0.7, 0.3], seed=8)[1]

    def loader(**kw: Any) -> DataLoader:
        return DataLoader(_streams(), 8, mode, 5, indices=members, **kw)  # type: ignore[arg-type]

    with loader(num_threads=1) as whole:
        expected = [next(whole)["y"] for _ in range(20)]
    got: list[np.ndarray] = []
    state = None
    for stop, threads, prefetch in [(0, 2, 2), (3, 1, 1), (7, 3, 5), (10, 2, 8)]:
        with loader(num_threads=threads, prefetch=prefetch) as dl:
            if state is not None:
                dl.load_state_dict(state)
            got += [next(dl)["y"] for _ in range(stop)]
            state = json.loads(json.dumps(dl.state_dict()))
    assert state is not None and state["indices"].startswith(f"{len(members)}:")
    np.testing.assert_array_equal(np.stack(got), np.stack(expected))


def test_a_state_from_another_subset_is_refused() -> None:
    a, b = chute.split(N, [0.5, 0.5], seed=1)
    with DataLoader(_streams(), 8, indices=a) as dl:
        state = dl.state_dict()
    with DataLoader(_streams(), 8, indices=b) as other, pytest.raises(ValueError, match="saved"):
        other.load_state_dict(state)
    with DataLoader(_streams(), 8) as full, pytest.raises(ValueError, match="indices: saved"):
        full.load_state_dict(state)
    with DataLoader(_streams(), 8, indices=a.copy()) as same:
        same.load_state_dict(state)  # same members, another array: accepted


def test_subset_with_shards_partitions_the_global_batch() -> None:
    members = np.arange(0, N, 3)
    with DataLoader(_streams(), 12, "cyclic", 4, indices=members) as whole:
        expected = [next(whole)["y"] for _ in range(4)]
    parts = []
    for i in range(3):
        with DataLoader(_streams(), 12, "cyclic", 4, shard=(i, 3), indices=members) as dl:
            parts.append([next(dl)["y"] for _ in range(4)])
    for step in range(4):
        np.testing.assert_array_equal(np.concatenate([p[step] for p in parts]), expected[step])


def test_bad_subsets_are_clear_errors() -> None:
    with pytest.raises(IndexError, match="holds 503, outside the streams' 503 records"):
        DataLoader(_streams(), 8, indices=[0, N])
    with pytest.raises(IndexError, match="holds -1"):
        DataLoader(_streams(), 8, indices=[-1, 2])
    with pytest.raises(TypeError, match="must hold integers"):
        DataLoader(_streams(), 8, indices=[0.5, 1.0])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        DataLoader(_streams(), 8, indices=[])
    with pytest.raises(ValueError, match="without replacement"):
        DataLoader(_streams(), 8, "cyclic", indices=[1, 2, 3])
