"""InSituDataset through its public API: coverage, values, fetch counts, order, memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import zarr

from chute.insitu import (
    BadChunkError,
    InSituDataset,
    SplitManifest,
    open_geometries,
    split_by_chunk,
)

from .conftest import CHUNK, CountingStore, N, x_values
from .test_damaged_files import damage

VARS = ["x", "y", "z"]


def manifest_of(path: Path | str) -> SplitManifest:
    return split_by_chunk(open_geometries(path)["x"])


def dataset(store: object, **kw: object) -> InSituDataset:
    geoms = open_geometries(store, VARS, sample_axis=0)  # type: ignore[arg-type]
    geoms["z"] = open_geometries(store, ["z"], sample_axis=1)["z"]  # type: ignore[arg-type]
    return InSituDataset(store, manifest_of(store), geoms, **kw)  # type: ignore[arg-type]


def check_values(batch: dict[str, np.ndarray]) -> None:
    idx = batch["sample_indices"]
    np.testing.assert_array_equal(batch["x"], x_values(idx))
    np.testing.assert_array_equal(batch["y"], idx)
    np.testing.assert_array_equal(batch["z"], np.stack([idx, -idx], axis=1))


def indices(batches: Iterable[dict[str, np.ndarray]]) -> list[np.ndarray]:
    return [b["sample_indices"] for b in batches]


def test_train_epoch_yields_each_train_sample_once_with_source_values(archive: Path) -> None:
    with dataset(archive, batch_size=10) as ds:
        m = ds.manifest
        batches = list(ds.train)
        for b in batches:
            check_values(b)
            assert b["x"].shape[0] == len(b["sample_indices"]) <= 10
        seen = np.concatenate(indices(batches))
        assert sorted(seen.tolist()) == m.sample_indices("train").tolist()
        assert not set(seen.tolist()) & set(
            m.sample_indices("val").tolist() + m.sample_indices("test").tolist()
        )
        assert [len(b["y"]) for b in batches[:-1]] == [10] * (len(batches) - 1)
        assert len(ds.train) == len(batches)


def test_eval_views_are_deterministic_and_complete(archive: Path) -> None:
    with dataset(archive, batch_size=7) as ds:
        val0 = indices(ds.val)
        ds.set_epoch(3)
        val3 = indices(ds.val)
        assert [a.tolist() for a in val0] == [a.tolist() for a in val3]
        assert np.concatenate(val0).tolist() == ds.manifest.sample_indices("val").tolist()
        every = list(ds.all)
        for b in every:
            check_values(b)
        assert sorted(np.concatenate(indices(every)).tolist()) == list(range(N))
        assert (
            sorted(np.concatenate(indices(ds.test)).tolist())
            == ds.manifest.sample_indices("test").tolist()
        )


def test_epochs_shuffle_differently_and_reproducibly(archive: Path) -> None:
    with dataset(archive, batch_size=16, block_chunks=4) as ds:
        e0 = np.concatenate(indices(ds.train))
        ds.set_epoch(1)
        e1 = np.concatenate(indices(ds.train))
    assert sorted(e0.tolist()) == sorted(e1.tolist()) and e0.tolist() != e1.tolist()
    with dataset(archive, batch_size=16, block_chunks=4) as again:
        assert np.concatenate(indices(again.train)).tolist() == e0.tolist()
    with dataset(archive, batch_size=16, block_chunks=4, seed=5) as other:
        assert np.concatenate(indices(other.train)).tolist() != e0.tolist()


def test_shuffle_stays_within_windows_of_block_chunks(archive: Path) -> None:
    with dataset(archive, batch_size=8, block_chunks=3) as ds:
        order = np.concatenate(indices(ds.train))
    window = 3 * CHUNK
    for start in range(0, len(order), window):
        chunks = set((order[start : start + window] // CHUNK).tolist())
        assert len(chunks) <= 3


def test_each_stored_chunk_is_fetched_once_per_epoch(counting: CountingStore) -> None:
    with dataset(counting, batch_size=8, block_chunks=3) as ds:
        counting.gets.clear()
        list(ds.train)
        gets = counting.chunk_gets()
        assert gets and max(gets.values()) == 1
        n_train_chunks = len(ds.manifest.chunk_ids("train"))
        assert len([k for k in gets if k.startswith("x/")]) == n_train_chunks


def test_pool_caches_across_epochs_and_splits_while_it_fits(counting: CountingStore) -> None:
    with dataset(counting, batch_size=8, cache_budget_bytes=10**6) as ds:
        list(ds.train)
        counting.gets.clear()
        ds.set_epoch(1)
        list(ds.train)
        assert counting.chunk_gets() == {}
        list(ds.all)  # train chunks come from the pool; only val+test are read
        read = {
            k.split("/c/")[1].split("/")[0] for k in counting.chunk_gets() if k.startswith("y/")
        }
        expected = {
            str(c)
            for c in np.concatenate([ds.manifest.chunk_ids("val"), ds.manifest.chunk_ids("test")])
        }
        assert read == expected
        assert ds.stats()["hits"] > 0


def test_memory_stays_within_the_budget(counting: CountingStore) -> None:
    geoms = open_geometries(counting, ["x"])
    per_chunk = geoms["x"].slab_nbytes
    budget = 5 * per_chunk
    ds = InSituDataset(
        counting,
        manifest_of(counting),
        geoms,
        batch_size=4,
        block_chunks=2,
        cache_budget_bytes=budget,
    )
    with ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            assert (
                sorted(np.concatenate(indices(ds.train)).tolist())
                == ds.manifest.sample_indices("train").tolist()
            )
            list(ds.val)
        stats = ds.stats()
    assert 0 < stats["peak_bytes"] <= budget
    assert stats["evictions"] > 0
    assert max(counting.chunk_gets().values()) <= 2  # once per epoch: nothing fits across


def test_budget_below_the_working_set_is_refused(archive: Path) -> None:
    with pytest.raises(ValueError, match="cache_budget_bytes"):
        dataset(archive, batch_size=32, block_chunks=4, cache_budget_bytes=100)


def test_shards_are_disjoint_cover_the_split_and_have_equal_batch_counts(tmp_path: Path) -> None:
    g = zarr.open_group(str(tmp_path / "even.zarr"), mode="w")
    g.create_array("v", shape=(96,), chunks=(4,), dtype="i8")[:] = np.arange(96)
    m = split_by_chunk(open_geometries(tmp_path / "even.zarr")["v"], (1.0, 0.0, 0.0))
    for epoch in range(2):
        per_rank = []
        for rank in range(3):
            with InSituDataset(
                tmp_path / "even.zarr", m, batch_size=5, shard=(rank, 3), block_chunks=2
            ) as ds:
                ds.set_epoch(epoch)
                per_rank.append(indices(ds.train))
        chunk_sets = [set((np.concatenate(r) // 4).tolist()) for r in per_rank]
        assert all(not (a & b) for i, a in enumerate(chunk_sets) for b in chunk_sets[i + 1 :])
        assert sorted(np.concatenate([np.concatenate(r) for r in per_rank]).tolist()) == list(
            range(96)
        )
        assert len({len(r) for r in per_rank}) == 1


def test_uneven_shards_still_get_equal_batch_counts(archive: Path) -> None:
    counts = []
    for rank in range(4):
        with dataset(archive, batch_size=6, shard=(rank, 4)) as ds:
            counts.append(len(list(ds.train)))
    assert len(set(counts)) == 1


def test_resume_mid_epoch_reproduces_the_remaining_batches(archive: Path) -> None:
    with dataset(archive, batch_size=9, block_chunks=3) as ds:
        ds.set_epoch(2)
        full = indices(ds.train)
        ds.set_epoch(2)
        it = iter(ds.train)
        head = [next(it)["sample_indices"] for _ in range(5)]
        state = ds.state_dict()
        it.close()
    assert [h.tolist() for h in head] == [f.tolist() for f in full[:5]]
    with dataset(archive, batch_size=9, block_chunks=3) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed.train)
        for b in rest:
            check_values(b)
        assert [r["sample_indices"].tolist() for r in rest] == [f.tolist() for f in full[5:]]
    with (
        dataset(archive, batch_size=8, block_chunks=3) as other,
        pytest.raises(ValueError, match="order"),
    ):
        other.load_state_dict(state)


def test_breaking_out_early_leaves_the_dataset_usable(archive: Path) -> None:
    with dataset(archive, batch_size=4, block_chunks=2) as ds:
        for i, _ in enumerate(ds.train):
            if i == 2:
                break
        ds.set_epoch(0)
        assert sum(len(b["y"]) for b in ds.train) == len(ds.manifest.sample_indices("train"))


def test_mmap_pool_under_cache_dir(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with dataset(archive, batch_size=16, cache_dir=cache, cache_budget_bytes=10**6) as ds:
        for b in ds.train:
            check_values(b)
        assert ds.stats()["resident_bytes"] > 0
        (pool,) = os.listdir(cache)
        slabs = [f for f in os.listdir(cache / pool) if f.endswith(".slab")]
        assert len(slabs) == 3 * len(ds.manifest.chunk_ids("train"))  # x, y, z
    assert os.listdir(cache) == []  # the last process to leave removes the pool
    with pytest.raises(FileNotFoundError):
        dataset(archive, cache_dir=tmp_path / "absent")


def test_sharded_chunked_and_compressed_layouts(tmp_path: Path) -> None:
    root = zarr.open_group(str(tmp_path / "lay.zarr"), mode="w")
    vals = x_values(np.arange(70))
    root.create_array("sharded", shape=(70, 3, 5), chunks=(5, 3, 5), shards=(10, 3, 5), dtype="f4")[
        :
    ] = vals
    root.create_array("tiled", shape=(70, 3, 5), chunks=(10, 2, 2), dtype="f4")[:] = vals
    root.create_array(
        "gzip", shape=(70, 3, 5), chunks=(10, 3, 5), dtype="f4", compressors=zarr.codecs.GzipCodec()
    )[:] = vals
    root.create_array("big_endian", shape=(70, 3, 5), chunks=(10, 3, 5), dtype=">f4")[:] = vals
    geoms = open_geometries(tmp_path / "lay.zarr")
    m = split_by_chunk(geoms["sharded"])
    with InSituDataset(tmp_path / "lay.zarr", m, batch_size=8) as ds:
        n = 0
        for b in ds.all:
            for name in geoms:
                np.testing.assert_array_equal(b[name], x_values(b["sample_indices"]))
            n += len(b["sample_indices"])
        assert n == 70


def test_bad_chunk_raise_names_the_key(archive: Path) -> None:
    bad = archive / "x" / "c" / "2" / "0" / "0"
    bad.write_bytes(b"not zstd at all")
    ds = dataset(archive, batch_size=8)
    with ds, pytest.raises(BadChunkError, match="x/c/2/0/0") as info:
        list(ds.all)
    assert info.value.key == "x/c/2/0/0"


def test_bad_chunk_skip_drops_its_samples_and_reports_it(archive: Path) -> None:
    (archive / "y" / "c" / "1").write_bytes(b"garbage")
    with dataset(archive, batch_size=8, on_bad_chunk="skip") as ds:
        seen = []
        for b in ds.all:
            check_values(b)
            seen.extend(b["sample_indices"].tolist())
        assert sorted(seen) == [i for i in range(N) if i // CHUNK != 1]
        assert ds.bad_chunks == ["y/c/1"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"shard": (3, 3)}, "shard"),
        ({"on_bad_chunk": "ignore"}, "on_bad_chunk"),
        ({"max_inflight": -1}, "max_inflight"),
    ],
)
def test_bad_arguments_are_refused(archive: Path, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataset(archive, **kw)


def test_manifest_that_fits_no_variable_is_refused(archive: Path) -> None:
    wrong = SplitManifest(n_chunks=1, sample_chunk_size=8, n_samples=5, chunks={"train": (0,)})
    with pytest.raises(ValueError, match="5 samples"):
        InSituDataset(archive, wrong)


def test_manifest_as_json_path_and_describe(archive: Path, tmp_path: Path) -> None:
    manifest_of(archive).to_json(tmp_path / "m.json")
    with InSituDataset(archive, tmp_path / "m.json", batch_size=16) as ds:
        assert set(ds.geometries) == {"x", "y"}  # z has samples on axis 1; lat is shorter
        before = ds.describe()
        assert before["limiting_stage"] == "unknown"
        list(ds.train)
        info = ds.describe()
    assert info["limiting_stage"] in {"consumer", "fetch", "decode", "transform+assemble"}
    assert info["memory"]["pool_budget_bytes"] >= info["memory"]["working_set_bytes"] > 0
    assert info["config"]["max_inflight"] >= 1 and info["config"]["block_chunks"] >= 1
    assert info["splits"]["train"]["samples"] == len(ds.manifest.sample_indices("train"))


def test_interleaved_views_share_one_pool(counting: CountingStore) -> None:
    with dataset(counting, batch_size=5, block_chunks=2, cache_budget_bytes=10**6) as ds:
        train, every = [], []
        for a, b in zip(ds.train, ds.all, strict=False):
            check_values(a)
            check_values(b)
            train.append(a["sample_indices"])
            every.append(b["sample_indices"])
        train.extend(indices(ds.train) if not train else [])
        assert max(counting.chunk_gets().values()) == 1  # one decode serves both passes


def test_views_iterated_from_two_threads_at_once(archive: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with dataset(archive, batch_size=6, block_chunks=2) as ds:

        def run(view: str) -> list[int]:
            seen: list[int] = []
            for b in getattr(ds, view):
                check_values(b)
                seen.extend(b["sample_indices"].tolist())
            return sorted(seen)

        with ThreadPoolExecutor(2) as pool:
            train, every = pool.map(run, ["train", "all"])
        assert train == ds.manifest.sample_indices("train").tolist()
        assert every == list(range(N))


def test_closing_mid_pass_ends_the_iterator_with_an_error(archive: Path) -> None:
    ds = dataset(archive, batch_size=4, block_chunks=2)
    it = iter(ds.train)
    next(it)
    ds.close()
    with pytest.raises(RuntimeError, match="closed"):
        list(it)
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(ds.val))
    ds.close()  # idempotent


def test_truncated_chunk_is_a_bad_chunk_and_a_missing_one_is_fill(archive: Path) -> None:
    key = archive / "x" / "c" / "4" / "0" / "0"
    key.write_bytes(key.read_bytes()[:-7])
    (archive / "y" / "c" / "5").unlink()  # zarr reads an absent chunk as the fill value
    with dataset(archive, batch_size=8) as ds, pytest.raises(BadChunkError, match="x/c/4/0/0"):
        list(ds.all)
    with dataset(archive, batch_size=8, on_bad_chunk="skip") as ds:
        for b in ds.all:
            idx = b["sample_indices"]
            assert not np.any(idx // CHUNK == 4)
            np.testing.assert_array_equal(b["y"], np.where(idx // CHUNK == 5, 0, idx))


def test_file_url_reads_the_same_as_a_plain_path(archive: Path) -> None:
    m = manifest_of(archive)
    with (
        InSituDataset(f"file://{archive}", m, batch_size=16) as a,
        InSituDataset(str(archive), m, batch_size=16) as b,
    ):
        for x, y in zip(a.train, b.train, strict=True):
            np.testing.assert_array_equal(x["sample_indices"], y["sample_indices"])
            np.testing.assert_array_equal(x["x"], y["x"])


def test_geometry_naming_a_missing_array_fails_cleanly(archive: Path) -> None:
    import threading

    from chute.insitu import ArrayGeometry

    before = threading.active_count()
    ghost = ArrayGeometry("ghost", (N,), (CHUNK,), "<f4")
    with pytest.raises(FileNotFoundError):
        InSituDataset(archive, manifest_of(archive), {"ghost": ghost})
    assert threading.active_count() == before  # the engine's threads were stopped


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link-out", "oversize"])
def test_a_chunk_file_that_is_not_a_plain_chunk_is_a_bad_chunk(
    archive: Path, tmp_path: Path, kind: str
) -> None:
    """A chunk file is read only as a regular file of at most a chunk's bytes: a FIFO hung
    the decode thread, /dev/zero or a sparse giant read until memory ran out, a link out
    was followed. Each is a `BadChunkError` naming its key (in a child: a hang fails)."""
    key = archive / "x" / "c" / "4" / "0" / "0"
    if kind == "oversize":
        with open(key, "wb") as f:
            f.truncate(1 << 40)  # sparse: a terabyte on paper
    else:  # chunk 4's own bytes go elsewhere, where a link out would find them
        damage(key, kind, tmp_path / "elsewhere")

    # a fresh interpreter, not a fork: this process's engine threads would not survive one
    script = textwrap.dedent(f"""
        import sys
        from chute.errors import BadChunkError
        from chute.insitu import InSituDataset, open_geometries, split_by_chunk
        path = {str(archive)!r}
        manifest = split_by_chunk(open_geometries(path)["x"])
        with InSituDataset(path, manifest, open_geometries(path, ["x"]), batch_size=8) as ds:
            try:
                list(ds.all)
            except BadChunkError as e:
                sys.exit(0 if "x/c/4/0/0" in str(e) else 3)
        sys.exit(4)
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
