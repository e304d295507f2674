# ruff: noqa: E501
"""Every public entry point checks an integer option and a keyword the same way: a bool or a
float is a TypeError, a negative or too large value a ValueError, each naming the option; a
misspelt keyword a TypeError naming the nearest valid one; old spellings warn and work."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import chute
import chute.metrics
from chute.datasets import ShardedStore
from chute.frameworks import to_device
from chute.insitu import InSituDataset, InSituOptions, open_geometries, split_by_chunk


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api")
    chute.write_dataset(root / "d.zr", np.arange(8)).close()
    chute.write_ragged(root / "r.zr", [np.arange(2)]).close()
    chute.write_dataset(root / "s", np.arange(8), shard_records=4).close()
    arr = zarr.open_group(root / "w.zarr", mode="w").create_array(
        "t", shape=(40, 2), chunks=(10, 2), dtype="f4"
    )
    arr[:] = 0
    return {
        "d": root / "d.zr",
        "r": root / "r.zr",
        "s": root / "s",
        "w": root / "w.zarr",
        "root": root,
    }


_OPEN: list[Any] = []


def _closing(handle: Any) -> Any:
    """``handle``, closed when the module's tests end (a gather returns an array, not it)."""
    _OPEN.append(handle)
    return handle


@pytest.fixture(scope="module", autouse=True)
def _close_handles() -> Any:
    yield
    for handle in _OPEN:
        handle.close()


def _insitu(files: dict[str, Path], **kw: Any) -> InSituDataset:
    path = str(files["w"])
    return InSituDataset(path, split_by_chunk(open_geometries(path)["t"], (0.5, 0.25, 0.25)), **kw)


# (entry point, option, accepts this value, has an upper bound)
ENTRIES: list[tuple[str, str, Callable[[dict[str, Path], Any], Any], bool]] = [
    ("DataLoader", "batch_size", lambda f, v: chute.DataLoader({"x": np.arange(8)}, v), True),
    ("DataLoader", "num_threads", lambda f, v: chute.DataLoader({"x": np.arange(8)}, 2, num_threads=v), True),
    ("DataLoader", "prefetch", lambda f, v: chute.DataLoader({"x": np.arange(8)}, 2, prefetch=v), True),
    ("EvalPass", "batch_size", lambda f, v: chute.EvalPass({"x": np.arange(8)}, v), True),
    ("EvalPass", "prefetch", lambda f, v: chute.EvalPass({"x": np.arange(8)}, 2, prefetch=v), True),
    ("Sampler", "batch_size", lambda f, v: chute.Sampler(8, v), True),
    ("WeightedSampler", "batch_size", lambda f, v: chute.WeightedSampler([1.0, 2.0], v), True),
    ("split", "n", lambda f, v: chute.split(v, [1.0]), False),
    ("Dataset", "num_threads", lambda f, v: chute.Dataset(f["d"], num_threads=v), False),
    ("RaggedDataset", "num_threads", lambda f, v: chute.RaggedDataset(f["r"], num_threads=v), False),
    ("RecordStore", "num_threads", lambda f, v: chute.RecordStore(f["d"], num_threads=v), False),
    ("write_dataset", "shard_records", lambda f, v: chute.write_dataset(f["root"] / "o", np.arange(4), shard_records=v, overwrite=True), True),
    ("write_dataset", "workers", lambda f, v: chute.write_dataset(f["root"] / "o", np.arange(4), shard_records=2, workers=v, overwrite=True), False),
    ("InSituDataset", "batch_size", lambda f, v: _insitu(f, batch_size=v), False),
    ("InSituDataset", "prefetch", lambda f, v: _insitu(f, prefetch=v), False),
    ("InSituDataset", "num_threads", lambda f, v: _insitu(f, num_threads=v), False),
    ("InSituOptions", "max_inflight", lambda f, v: InSituOptions(max_inflight=v), False),
    ("RecordStore.gather", "num_threads", lambda f, v: _closing(chute.RecordStore(f["d"])).gather([0, 1], num_threads=v), False),
    ("RecordStore.gather_packed", "num_threads", lambda f, v: _closing(chute.RecordStore(f["d"])).gather_packed([0], num_threads=v), False),
    ("ShardedStore.gather_into", "num_threads", lambda f, v: _closing(ShardedStore(f["s"])).gather_into([0, 5], np.zeros(2, np.int64), [0, 8], num_threads=v), False),
    ("to_device", "depth", lambda f, v: to_device(chute.DataLoader({"x": np.arange(8.0)}, 2), "cpu", depth=v), True),
    ("CompactingWriter", "hotsize", lambda f, v: chute.metrics.CompactingWriter(f["root"] / "m", hotsize=v), False),
    ("DirectWriter", "write_threads", lambda f, v: chute.metrics.DirectWriter(f["root"] / "n", write_threads=v - 1 if isinstance(v, int) and not isinstance(v, bool) else v), False),
]  # fmt: skip


def _close(made: Any) -> None:
    if hasattr(made, "close"):
        made.close()
    elif hasattr(made, "finish"):
        made.finish()


@pytest.mark.parametrize(("where", "option", "make", "bounded"), ENTRIES, ids=lambda e: str(e))
def test_every_entry_checks_an_integer_option_alike(
    files: dict[str, Path], where: str, option: str, make: Callable[..., Any], bounded: bool
) -> None:
    for bad in (True, 2.0):
        with pytest.raises(TypeError, match=rf"{option} must be an int, got"):
            make(files, bad)
    with pytest.raises(ValueError, match=rf"{option} must be"):
        make(files, -1)
    if bounded:
        with pytest.raises(ValueError, match=rf"{option} must be in \["):
            make(files, 2**70)
    _close(make(files, np.int64(4)))  # numpy integers are ints


MISSPELT: list[tuple[str, Callable[[dict[str, Path]], Any], str]] = [
    ("DataLoader", lambda f: chute.DataLoader({"x": np.arange(8)}, 2, prefech=2), "prefetch"),
    ("EvalPass", lambda f: chute.EvalPass({"x": np.arange(8)}, 2, num_thread=2), "num_threads"),
    ("Dataset", lambda f: chute.Dataset(f["d"], verfy=True), "verify"),
    ("RecordStore", lambda f: chute.RecordStore(f["d"], num_thread=2), "num_threads"),
    ("write_dataset", lambda f: chute.write_dataset(f["root"] / "p", np.arange(3), shard_record=2), "shard_records"),
    ("InSituDataset", lambda f: _insitu(f, bacth_size=8), "batch_size"),
    ("to_device", lambda f: to_device(chute.DataLoader({"x": np.arange(8.0)}, 2), "cpu", dept=2), "depth"),
    ("chute.ray.write_dataset", lambda f: __import__("chute.ray").ray.write_dataset(f["root"] / "q", None, shard_record=2), "shard_records"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "make", "near"), MISSPELT, ids=lambda e: str(e))
def test_a_misspelt_keyword_names_the_nearest(
    files: dict[str, Path], where: str, make: Callable[..., Any], near: str
) -> None:
    with pytest.raises(TypeError, match=rf"unexpected keyword argument .*did you mean '{near}'"):
        make(files)


def test_old_spellings_warn_and_work(files: dict[str, Path]) -> None:
    with pytest.warns(
        DeprecationWarning, match="threads= is deprecated; chute spells it num_threads="
    ):
        chute.Dataset(files["d"], threads=2).close()
    with pytest.warns(DeprecationWarning, match="spells it num_threads="):
        chute.RecordStore(files["d"], threads=2).close()
    with chute.RecordStore(files["d"]) as store, ShardedStore(files["s"]) as sharded:
        for source in (store, sharded):
            with pytest.warns(
                DeprecationWarning, match="threads= is deprecated; chute spells it num_threads="
            ):
                assert source.gather([1], threads=1).view(np.int64).tolist() == [[1]]
            with pytest.raises(TypeError, match=r"both threads= \(deprecated\) and num_threads="):
                source.gather_packed([1], threads=1, num_threads=1)
    with pytest.warns(
        DeprecationWarning, match="prefetch_depth= is deprecated; chute spells it prefetch="
    ):
        ds = _insitu(files, prefetch_depth=3, batch_size=8)
    assert ds.config.prefetch_depth == 3
    ds.close()
    with pytest.warns(
        DeprecationWarning, match="decode_threads= is deprecated; chute spells it num_threads="
    ):
        _insitu(files, decode_threads=2, batch_size=8).close()
    with pytest.warns(DeprecationWarning, match=r"DataLoader\(\): pass sampler= by name"):
        loader = chute.DataLoader({"x": np.arange(8)}, 4, "sequential")
    assert next(loader)["x"].tolist() == [0, 1, 2, 3]
    loader.close()
    with pytest.warns(DeprecationWarning, match=r"write_dataset\(\): pass codec= by name"):
        assert chute.write_dataset(files["root"] / "c", np.arange(3), "raw")[:].tolist() == [
            0,
            1,
            2,
        ]
    with pytest.warns(DeprecationWarning, match=r"write_ragged\(\): pass dtype="):
        chute.write_ragged(files["root"] / "g", [[1, 2]], np.int16).close()


def test_insitu_options_as_one_value(files: dict[str, Path]) -> None:
    options = InSituOptions(batch_size=8, prefetch=3, num_threads=2)
    with _insitu(files, options=options) as ds:
        assert (ds.config.batch_size, ds.config.prefetch_depth, ds.config.decode_threads) == (
            8,
            3,
            2,
        )
        assert ds.options == options
    with pytest.raises(TypeError, match="not both"):
        _insitu(files, options=options, batch_size=4)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        _insitu(files, batch_size=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _insitu(files, batch_size=np.int64(8)).close()
