"""The record formats users pick instead of chute, for bench/store.py and bench/loader.py.

Grain's ArrayRecord (``array-record``, ``group_size:1`` for random access, uncompressed or
zstd, read through Grain's ``ArrayRecordDataSource`` and ``DataLoader``), MosaicML Streaming
(MDS shards read through ``LocalDataset`` / ``StreamingDataset``) and LitData
(``optimize`` + ``StreamingDataset``). Every writer stores one record per row of a dict of
equally long arrays (``{"data": images, "label": labels}``); every reader gives the same
dict of stacked arrays back, so the benchmarks compare like with like. Each family is
``None`` when its package is not installed (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

Columns = dict[str, np.ndarray]
"""Equally long arrays, one record per row; a reader returns the rows it was asked for."""


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def like_of(columns: Columns) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    return {k: (a.dtype, a.shape[1:]) for k, a in columns.items()}


def _stack(rows: Sequence[dict[str, Any]], like: dict[str, Any]) -> Columns:
    """Rows of ``{name: bytes}`` as one array per name, shaped as written."""
    return {
        k: np.frombuffer(b"".join(bytes(r[k]) for r in rows), dtype).reshape(len(rows), *shape)
        for k, (dtype, shape) in like.items()
    }


# -- Grain's ArrayRecord --------------------------------------------------------------------


def _split_record(record: bytes, like: dict[str, Any]) -> dict[str, bytes]:
    """An ArrayRecord record holds the row of every column end to end."""
    out, at = {}, 0
    for k, (dtype, shape) in like.items():
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out[k], at = record[at : at + n], at + n
    return out


def arrayrecord_write(path: Path, columns: Columns, zstd: bool) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(path), "group_size:1," + ("zstd" if zstd else "uncompressed"))
    n = len(next(iter(columns.values())))
    for i in range(n):
        writer.write(b"".join(a[i].tobytes() for a in columns.values()))
    writer.close()


def arrayrecord_reader(path: Path, like: dict[str, Any]) -> Callable[[np.ndarray], Columns]:
    import grain.python as grain

    source = grain.ArrayRecordDataSource(str(path))

    def read(idx: np.ndarray) -> Columns:
        records = source.__getitems__(idx.tolist())
        return _stack([_split_record(r, like) for r in records], like)

    return read


def _grain_decode(like: dict[str, Any]) -> Any:
    import grain.python as grain

    class Decode(grain.MapTransform):  # type: ignore[misc]
        def map(self, record: bytes) -> Columns:
            rows = _stack([_split_record(record, like)], like)
            return {k: v[0] for k, v in rows.items()}

    return Decode()


def grain_loader(path: Path, like: dict[str, Any], batch: int, workers: int) -> Iterator[Any]:
    """Grain's DataLoader over the ArrayRecord file: shuffled, endless, batched."""
    import grain.python as grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags; no absl.app here
        flags.FLAGS.mark_as_parsed()

    source = grain.ArrayRecordDataSource(str(path))
    sampler = grain.IndexSampler(
        num_records=len(source), shuffle=True, seed=0, num_epochs=None,
        shard_options=grain.NoSharding(),
    )  # fmt: skip
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[_grain_decode(like), grain.Batch(batch, drop_remainder=True)],
        worker_count=workers,
    )
    return iter(loader)


# -- MosaicML Streaming (MDS) ---------------------------------------------------------------


def _streaming() -> types.ModuleType:
    # streaming/__init__ imports its torchvision datasets; the only torchvision wheel for
    # the CPU torch pinned here is a CUDA build that cannot load, and MDS never needs it.
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def mds_write(path: Path, columns: Columns, zstd: bool, size_limit: int = 1 << 27) -> None:
    """MDS shards of at most ``size_limit`` bytes each (before compression)."""
    streaming = _streaming()
    spec = dict.fromkeys(columns, "bytes")
    n = len(next(iter(columns.values())))
    with streaming.MDSWriter(
        out=str(path), columns=spec, compression="zstd" if zstd else None, size_limit=size_limit
    ) as w:
        for i in range(n):
            w.write({k: a[i].tobytes() for k, a in columns.items()})


def mds_dataset(path: Path, shuffle: bool = False, batch: int | None = None) -> Any:
    """``LocalDataset`` for plain shards; compressed shards need ``StreamingDataset``, which
    unpacks them into its local cache (here the "remote" is the folder written)."""
    streaming = _streaming()
    compressed = any(p.suffix == ".zstd" for p in path.iterdir())
    if not compressed and not shuffle:
        return streaming.LocalDataset(local=str(path))
    cache = path.with_name(path.name + "-cache")
    return streaming.StreamingDataset(
        remote=str(path), local=str(cache), shuffle=shuffle, batch_size=batch, shuffle_seed=0
    )


def mds_reader(path: Path, like: dict[str, Any]) -> Callable[[np.ndarray], Columns]:
    ds = mds_dataset(path)
    return lambda idx: _stack([ds[int(i)] for i in idx], like)


# -- LitData --------------------------------------------------------------------------------


def _litdata_row(npys: dict[str, str], i: int) -> dict[str, bytes]:
    return {k: np.load(p, mmap_mode="r")[i].tobytes() for k, p in npys.items()}


def litdata_write(path: Path, columns: Columns, chunk_size: int | None = None) -> None:
    """``litdata.optimize`` in one worker; rows come from .npy copies (workers reopen them).
    Chunks of 64 MB, or of ``chunk_size`` records when given."""
    import multiprocessing

    import litdata

    start_method = multiprocessing.get_start_method(allow_none=True)
    path.mkdir(parents=True)
    npys = {}
    for k, a in columns.items():
        npys[k] = str(path.with_name(f"{path.name}-{k}.npy"))
        np.save(npys[k], a)
    n = len(next(iter(columns.values())))
    litdata.optimize(
        fn=functools.partial(_litdata_row, npys), inputs=list(range(n)), output_dir=str(path),
        chunk_bytes=None if chunk_size else "64MB", chunk_size=chunk_size, num_workers=1,
        mode="overwrite",
    )  # fmt: skip
    for p in npys.values():
        os.unlink(p)
    # optimize() switches the whole process to "spawn"; the other loaders keep their default
    multiprocessing.set_start_method(start_method, force=True)


def litdata_reader(path: Path, like: dict[str, Any]) -> Callable[[np.ndarray], Columns]:
    import litdata

    ds = litdata.StreamingDataset(input_dir=str(path))
    return lambda idx: _stack([ds[int(i)] for i in idx], like)


def collate(like: dict[str, Any]) -> Callable[[list[dict[str, Any]]], Columns]:
    """A torch-style collate for MDS and LitData loaders: rows of bytes to stacked arrays."""
    return functools.partial(_stack, like=like)
