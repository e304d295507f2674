"""Resume at the edges of a pass: after its last batch, and around skipped bad chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from chute.insitu import InSituDataset, open_geometries, split_by_chunk


def small_archive(path: Path, n: int = 40) -> Path:
    x = zarr.open_group(str(path), mode="w").create_array(
        "x", shape=(n, 2), chunks=(8, 2), dtype="f4"
    )
    x[:] = np.arange(2 * n, dtype="f4").reshape(n, 2)
    return path


def indices(batches: Any) -> list[list[int]]:
    return [b.sample_indices.tolist() for b in batches]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_state_saved_after_the_last_batch_resumes_after_it(tmp_path: Path, shuffle: bool) -> None:
    """A checkpoint taken right after the last batch of a pass (every N steps, N dividing
    the epoch) resumes with nothing left of that pass; the next pass is the one an
    uninterrupted run makes next."""
    path = small_archive(tmp_path / "a.zarr")
    m = split_by_chunk(open_geometries(path)["x"], (1.0, 0.0, 0.0))
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": shuffle, "num_threads": 1}
    with InSituDataset(path, m, **kw) as ds:
        for _ in ds.train:
            state = ds.state_dict()
        again = indices(ds.train)  # the uninterrupted run's next pass over the epoch
        ds.set_epoch(1)
        following = indices(ds.train)
    assert state["positions"]["train"] == 5
    with InSituDataset(path, m, **kw) as ds:
        ds.load_state_dict(state)
        assert indices(ds.train) == []
        assert indices(ds.train) == again
        ds.set_epoch(1)
        assert indices(ds.train) == following


def skip_archive(tmp_path: Path) -> Path:
    path = small_archive(tmp_path / "s.zarr")
    (path / "x" / "c" / "1" / "0").write_bytes(b"garbage")  # samples 8..15
    return path


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_skip_resume_equals_the_uninterrupted_run(tmp_path: Path, k: int) -> None:
    """Batches emptied by a skipped chunk count in the saved position, so a resume (or
    iterating again after closing a pass) neither repeats nor drops a batch."""
    path = skip_archive(tmp_path)
    m = split_by_chunk(open_geometries(path)["x"], (1.0, 0.0, 0.0))
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": False, "on_bad_chunk": "skip"}
    with InSituDataset(path, m, num_threads=1, **kw) as ds:
        full = indices(ds.train)
        it = iter(ds.train)
        first = [next(it).sample_indices.tolist() for _ in range(k)]
        state = ds.state_dict()
        it.close()
        assert first + indices(ds.train) == full  # iterating again continues
    assert len(full) == 8 and [8, 9, 10, 11] not in full
    with InSituDataset(path, m, num_threads=1, **kw) as ds:
        ds.load_state_dict(state)
        assert first + indices(ds.train) == full


@pytest.mark.parametrize("world", [2, 3, 5, 9])
def test_sharded_evaluation_splits_are_read_whole_across_ranks(tmp_path: Path, world: int) -> None:
    """val/test/all are spread over the ranks by sample: every sample on exactly one rank,
    however few chunks the split has (a one-chunk val was empty on every rank)."""
    path = small_archive(tmp_path / "a.zarr", n=96)  # 12 chunks: train 9, val 1, test 2
    m = split_by_chunk(open_geometries(path)["x"], (0.8, 0.1, 0.1))
    got: dict[str, list[int]] = {"val": [], "test": [], "all": []}
    for rank in range(world):
        with InSituDataset(path, m, batch_size=4, shard=(rank, world), num_threads=1) as ds:
            for view in got:
                part = [i for b in getattr(ds, view) for i in b.sample_indices.tolist()]
                assert part == sorted(part)
                got[view] += part
    for view, seen in got.items():
        assert seen == m.sample_indices(view).tolist(), view


def test_a_shard_that_would_empty_train_on_every_rank_is_refused(tmp_path: Path) -> None:
    path = small_archive(tmp_path / "a.zarr", n=80)  # train: 8 chunks
    m = split_by_chunk(open_geometries(path)["x"], (0.8, 0.1, 0.1))
    with pytest.raises(ValueError, match=r"'train' split .* 8 chunks for 100 ranks"):
        InSituDataset(path, m, batch_size=4, shard=(0, 100))
