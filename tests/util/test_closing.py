"""One ``with`` behaviour for everything chute opens: the block gets the object itself, and
leaving it closes the object, also when the block raises (the error is not swallowed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute._util.closing import Closing
from chute.datasets import ShardedStore
from chute.metrics import CompactingWriter, DirectWriter, Reader

ROWS = np.arange(40, dtype=np.int32).reshape(20, 2)


def _opened(kind: str, tmp: Path) -> tuple[Any, Callable[[], None]]:
    """An open object of ``kind`` and a call that fails once it is closed."""
    if kind == "RecordStore":
        store = chute.RecordStore(tmp / "s.zr", mode="w")
        return store, lambda: store.append([b"x"])
    if kind in ("Dataset", "ShardedStore"):
        ds = chute.write_dataset(tmp / "d", ROWS, shard_records=5)
        target: Any = ds if kind == "Dataset" else ds.store
        assert isinstance(ds.store, ShardedStore)
        return target, lambda: ds[0]
    if kind == "RaggedDataset":
        rd = chute.write_ragged(tmp / "r.zr", [ROWS[:3], ROWS[:1]])
        return rd, lambda: rd[0]
    if kind in ("DirectWriter", "CompactingWriter"):
        writer = (
            DirectWriter(tmp / "run")
            if kind == "DirectWriter"
            else CompactingWriter(tmp / "run", hotsize=10)
        )
        return writer, lambda: writer.write(loss=1.0)
    if kind == "Reader":
        with DirectWriter(tmp / "run") as w:
            w.write(loss=1.0)
        reader = Reader(tmp / "run")
        return reader, lambda: reader.refresh()
    if kind == "InSituDataset":
        zarr = pytest.importorskip("zarr")
        from chute.insitu import InSituDataset, open_geometries, split_by_chunk

        arr = zarr.open_group(str(tmp / "a.zarr"), mode="w").create_array(
            "x", shape=(20, 2), chunks=(5, 2), dtype="i4"
        )
        arr[:] = ROWS
        ds = InSituDataset(tmp / "a.zarr", split_by_chunk(open_geometries(tmp / "a.zarr")["x"]))
        return ds, lambda: next(iter(ds.train))
    loader = chute.DataLoader({"x": ROWS}, batch_size=4, num_threads=2)
    if kind == "DataLoader":
        return loader, lambda: next(loader)
    passes = chute.iterate({"x": ROWS}, 4)
    return passes, lambda: next(passes)


KINDS = [
    "RecordStore", "Dataset", "ShardedStore", "RaggedDataset", "DirectWriter",
    "CompactingWriter", "Reader", "DataLoader", "EvalPass", "InSituDataset",
]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_with_gives_the_object_and_closes_it_even_when_the_block_raises(
    tmp_path: Path, kind: str
) -> None:
    obj, use = _opened(kind, tmp_path)
    assert isinstance(obj, Closing)
    with pytest.raises(KeyError, match="from the block"), obj as entered:
        assert entered is obj
        use()  # open: works
        raise KeyError("from the block")
    if kind != "Reader":  # a reader of a plain run directory holds nothing to refuse with
        with pytest.raises(Exception, match=r"(?i)closed"):
            use()
