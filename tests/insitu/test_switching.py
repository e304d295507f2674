"""What an insitubatch user meets on switching: batches, arguments, errors, order, reports."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from chute.insitu import Batch, InSituDataset, SplitManifest, open_geometries, split_by_chunk

from .conftest import CHUNK, N, x_values


def manifest_of(path: Path) -> SplitManifest:
    return split_by_chunk(open_geometries(path)["x"])


def test_batches_read_as_insitubatch_batches_and_as_dicts(archive: Path) -> None:
    with InSituDataset(archive, manifest_of(archive), batch_size=8) as ds:
        b = next(iter(ds.val))
    assert isinstance(b, Batch) and isinstance(b, dict)
    assert sorted(b) == ["sample_indices", "x", "y"]  # iteration over keys, as before
    assert sorted(b.arrays) == ["x", "y"] and b.arrays["x"] is b["x"]
    assert b.sample_indices is b["sample_indices"]
    np.testing.assert_array_equal(b.arrays["x"], x_values(b.sample_indices))
    assert b.offsets == {"x": 0, "y": 0}
    np.testing.assert_array_equal(b.read_indices("y"), b.sample_indices)
    both = b.stack(["y", "y"])
    assert both.shape == (8, 2) and (both[:, 1] == b["y"]).all()
    with pytest.raises(KeyError, match="nope"):
        b.stack(["nope"])


def test_batch_transforms_returning_plain_dicts_still_give_batches(archive: Path) -> None:
    def drop_x(batch: Batch) -> dict[str, np.ndarray]:
        return {k: v for k, v in batch.items() if k != "x"}

    m = manifest_of(archive)
    with InSituDataset(archive, m, batch_size=8, batch_transforms=[drop_x]) as ds:
        b = next(iter(ds.val))
    assert isinstance(b, Batch) and list(b.arrays) == ["y"]


@pytest.mark.parametrize(
    ("kw", "named", "nearest"),
    [
        ({"bacth_size": 8}, "bacth_size", "batch_size"),
        ({"shufle": False}, "shufle", "shuffle"),
        ({"cache_budget": 10}, "cache_budget", "cache_budget_bytes"),
        ({"endpoint": "http://x"}, "endpoint", None),  # a store option of s3 only
    ],
)
def test_unknown_keywords_name_the_nearest_valid_one_before_any_io(
    tmp_path: Path, kw: dict[str, Any], named: str, nearest: str | None
) -> None:
    # nothing exists at this path and the manifest file is absent: a TypeError, not an
    # OSError, proves the keyword was checked before anything was opened or read
    with pytest.raises(TypeError, match=named) as info:
        InSituDataset(tmp_path / "absent.zarr", tmp_path / "absent.json", **kw)
    if nearest is not None:
        assert f"did you mean {nearest!r}" in str(info.value)


def test_s3_store_options_are_checked_too(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="did you mean 'endpoint'"):
        InSituDataset("s3://bucket/a.zarr", tmp_path / "absent.json", endpiont="http://x")
    with pytest.raises(TypeError, match="insitubatch's persist="):
        InSituDataset(tmp_path / "absent.zarr", tmp_path / "absent.json", persist=True)


def test_open_geometries_and_fit_check_their_keywords_too(tmp_path: Path) -> None:
    from chute.insitu import StandardScaler

    with pytest.raises(TypeError, match="did you mean 'sample_axis'"):
        open_geometries(tmp_path / "absent.zarr", sample_axsi=1)
    with pytest.raises(TypeError, match="did you mean 'region'"):
        open_geometries("s3://bucket/a.zarr", regoin="x")
    with pytest.raises(TypeError, match="did you mean 'n_chunks'"):
        StandardScaler.fit(tmp_path / "absent.zarr", None, n_chunk=3)


def test_shuffle_false_gives_train_in_chunk_order(archive: Path) -> None:
    with InSituDataset(archive, manifest_of(archive), batch_size=8, shuffle=False) as ds:
        order = np.concatenate([b.sample_indices for b in ds.train])
        assert order.tolist() == ds.manifest.sample_indices("train").tolist()


def test_a_state_from_another_configuration_names_the_differing_fields(archive: Path) -> None:
    m = manifest_of(archive)
    with InSituDataset(archive, m, batch_size=8, block_chunks=3, seed=1) as ds:
        state = ds.state_dict()
    with (
        InSituDataset(archive, m, batch_size=16, block_chunks=3, seed=2) as other,
        pytest.raises(ValueError) as info,
    ):
        other.load_state_dict(state)
    text = str(info.value)
    assert "seed: saved 1, current 2" in text and "batch_size: saved 8, current 16" in text
    assert "block_chunks" not in text
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({**state, "version": 1})


def test_states_resume_from_json(archive: Path) -> None:
    import json

    m = manifest_of(archive)
    with InSituDataset(archive, m, batch_size=8, block_chunks=3, shard=(1, 2)) as ds:
        it = iter(ds.train)
        next(it)
        state = json.loads(json.dumps(ds.state_dict()))
        rest = [b.sample_indices.tolist() for b in it]
    with InSituDataset(archive, m, batch_size=8, block_chunks=3, shard=(1, 2)) as again:
        again.load_state_dict(state)
        assert [b.sample_indices.tolist() for b in again.train] == rest


def test_an_array_at_the_url_is_named_after_it(archive: Path) -> None:
    (geom,) = open_geometries(archive / "x").items()
    assert geom[0] == "x"
    m = split_by_chunk(geom[1])
    with InSituDataset(archive / "x", m, batch_size=8) as ds:
        assert list(ds.geometries) == ["x"]
        b = next(iter(ds.all))
        np.testing.assert_array_equal(b["x"], x_values(b.sample_indices))


def test_a_second_iter_of_an_open_pass_raises_and_never_repeats_a_batch(archive: Path) -> None:
    with InSituDataset(archive, manifest_of(archive), batch_size=8, block_chunks=2) as ds:
        full = [b.sample_indices.tolist() for b in ds.train]
        first = iter(ds.train)
        head = [next(first).sample_indices.tolist() for _ in range(3)]
        with pytest.raises(RuntimeError, match="already being iterated"):
            iter(ds.train)
        with pytest.raises(RuntimeError, match="open"):
            ds.set_epoch(1)
        other = iter(ds.val)  # another view is another pass
        next(other)
        other.close()
        first.close()  # the view is free again, and continues after the batches handed out
        tail = [b.sample_indices.tolist() for b in ds.train]
        assert head + tail == full
        it = iter(ds.train)  # a pass that ran to its end frees the view too
        del it
        assert len(list(ds.train)) == len(full)


def test_shuffled_order_does_not_use_numpys_generator(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = manifest_of(archive)
    with InSituDataset(archive, m, batch_size=8, block_chunks=3) as ds:
        ds.set_epoch(4)
        before = [b.sample_indices.tolist() for b in ds.train]

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the epoch order must not come from numpy's random streams")

    monkeypatch.setattr(np.random, "default_rng", forbidden)
    monkeypatch.setattr(np.random, "Generator", forbidden)
    with InSituDataset(archive, m, batch_size=8, block_chunks=3) as ds:
        ds.set_epoch(4)
        after = [b.sample_indices.tolist() for b in ds.train]
    assert after == before
    assert sorted(i for b in after for i in b) == m.sample_indices("train").tolist()


def test_shard_auto_asks_the_framework_like_the_step_loader(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = manifest_of(archive)
    fake_jax = SimpleNamespace(process_index=lambda: 1, process_count=lambda: 3)
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    with InSituDataset(archive, m, batch_size=8, shard="auto") as auto:
        assert auto.config.shard == (1, 3)
        seen = [b.sample_indices.tolist() for b in auto.train]
    with InSituDataset(archive, m, batch_size=8, shard=(1, 3)) as explicit:
        assert [b.sample_indices.tolist() for b in explicit.train] == seen
    with pytest.raises(TypeError, match="shard"):
        InSituDataset(archive, m, shard="everything")  # type: ignore[arg-type]


def _slow_transform(variable: str, chunk: np.ndarray) -> np.ndarray:
    time.sleep(0.05)
    return chunk


def _slow_batch(batch: Batch) -> Batch:
    time.sleep(0.05)
    return batch


@pytest.mark.parametrize(
    ("kw", "consumer_sleep", "stage"),
    [
        ({"chunk_transforms": [_slow_transform], "decode_threads": 1}, 0.0, "decode"),
        ({"batch_transforms": [_slow_batch]}, 0.0, "transform+assemble"),
        ({}, 0.05, "consumer"),
    ],
)
def test_describe_names_the_stage_the_measured_waits_point_at(
    archive: Path, kw: dict[str, Any], consumer_sleep: float, stage: str
) -> None:
    """The verdict reads measured waits: a stall of a loaded machine (a test suite's other
    threads, another process) can shift one pass's shares, so each case gets three passes,
    each with a fresh dataset, and one must name the stage."""
    m = split_by_chunk(open_geometries(archive)["x"], (0.5, 0.25, 0.25))
    verdicts = []
    for _ in range(3):
        with InSituDataset(archive, m, batch_size=CHUNK, block_chunks=2, **kw) as ds:
            for _ in ds.train:
                time.sleep(consumer_sleep)
            info = ds.describe()
        assert "consumer waited" in info["why"]
        verdicts.append((info["limiting_stage"], info["why"]))
        if info["limiting_stage"] == stage:
            break
    assert verdicts[-1][0] == stage, verdicts


def test_sample_range_splits_a_window_of_whole_chunks(archive: Path) -> None:
    geom = open_geometries(archive)["x"]
    m = split_by_chunk(geom, (0.6, 0.2, 0.2), sample_range=(20, 61))  # chunks 2..7
    used = sorted(c for ids in m.chunks.values() for c in ids)
    assert used == [2, 3, 4, 5, 6, 7] and m.n_chunks == geom.n_chunks
    with InSituDataset(archive, m, batch_size=8) as ds:
        seen = sorted(i for b in ds.train for i in b.sample_indices.tolist())
    assert seen == m.sample_indices("train").tolist() and seen[0] >= 16
    shuffled = split_by_chunk(geom, (0.5, 0.5, 0.0), contiguous=False, sample_range=(0, 17))
    assert sorted(c for ids in shuffled.chunks.values() for c in ids) == [0, 1, 2]
    for bad in [(5, 5), (-1, 3), (0, N + 1), (7,)]:
        with pytest.raises(ValueError, match="sample_range"):
            split_by_chunk(geom, sample_range=bad)  # type: ignore[arg-type]
