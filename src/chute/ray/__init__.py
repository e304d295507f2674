"""chute on Ray Data: convert a Ray Dataset to chute sharded datasets, read them back on Ray.

``pip install 'chute[ray]'``. Only this package imports Ray, and only when a function here
is called, so ``import chute`` never needs it.

A converted dataset is a directory with one sharded dataset per column and a small
``columns.json`` written last (see ``docs/scale.md``): fixed-shape columns open as
`chute.Dataset`, variable-length ones as `chute.RaggedDataset`, on any machine, Ray or not
(`open_columns`).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chute._objects import (
    check_options,
    is_option,
    is_remote_url,
    local_path,
    open_location,
    reads_remotely,
)
from chute._util.renamed import legacy_arguments
from chute.datasets import Dataset, RaggedDataset, is_sharded
from chute.datasets._internal import DATASET_LOCK, check_sharding, clear, writer_lock
from chute.errors import ColumnTypeError
from chute.ray._layout import COLUMNS_FILE, LOCK_FILE, STAGING, conversion_lock, open_columns
from chute.store._internal import META_FILE, parse_codec

if TYPE_CHECKING:
    from chute.ray._sink import ChuteDatasink

__all__ = ["ColumnTypeError", "open_columns", "read_dataset", "write_dataset"]

#: write_dataset's own keywords, named when a store option is misspelt.
_KEYWORDS = (
    "columns", "codec", "shard_records", "ragged", "overwrite", "ray_remote_args",
    "concurrency", "break_lock",
)  # fmt: skip


@legacy_arguments(
    renamed={"rows_per_shard": "shard_records", "ray_ds": "dataset"},
    positional=("columns", "codec", "shard_records"),
)
def write_dataset(
    path: str | os.PathLike[str],
    dataset: Any,
    *,
    columns: list[str] | None = None,
    codec: str = "zstd",
    shard_records: int = 1 << 16,
    ragged: Collection[str] = (),
    overwrite: bool = False,
    ray_remote_args: dict[str, Any] | None = None,
    concurrency: int | None = None,
    break_lock: bool = False,
    **store_options: Any,
) -> dict[str, Dataset | RaggedDataset]:
    """Convert ``dataset`` (a ``ray.data.Dataset``) through Ray's Datasink API into ``path``;
    returns the columns opened with chute. The arguments come in `chute.write_dataset`'s
    order (path, then data); the old order ``(ray_ds, path)`` and ``rows_per_shard=`` still
    work, with a `DeprecationWarning`.

    Write tasks run on the cluster, each writing whole shards of ``shard_records`` rows (so
    ``path`` must be a filesystem every worker sees); the manifests are written once every
    task has succeeded, and a retried task's leftovers are never part of the result. Row
    order is ``dataset``'s order. Columns of numeric arrays of one shape become
    `chute.Dataset` streams; columns of variable-length arrays (and those named in
    ``ragged``) become `chute.RaggedDataset` streams. ``ray_remote_args`` and
    ``concurrency`` go to ``dataset.write_datasink``. One conversion into ``path`` runs at a
    time: a second, while one runs, gets `StoreLockedError` before it touches anything.

    ``path`` may be a URL, ``s3://bucket/prefix``, ``gs://``, ``az://`` (or an obstore
    store), with ``store_options`` as `chute.write_dataset` takes them: each task stages its
    shards locally and uploads them, the driver commits the manifests last, and the old
    conversion there stays readable until then (see docs/scale.md); ``break_lock=True``
    takes over the lock of a conversion you know is dead. The columns it returns are opened
    by URL, with the same ``store_options`` (`open_columns` and `read_dataset` reopen them
    so).

    Skipped as a doctest: it starts a Ray cluster (``tests/ray`` runs it on a local one).

    >>> import numpy as np
    >>> import ray  # doctest: +SKIP
    >>> from chute.ray import write_dataset
    >>> items = [{"x": np.full(3, i), "tokens": np.arange(i % 7 + 1)} for i in range(100)]
    >>> rows = ray.data.from_items(items, override_num_blocks=4)  # doctest: +SKIP
    >>> cols = write_dataset("/data/conv", rows, shard_records=32)  # doctest: +SKIP
    >>> cols["x"].shape, type(cols["tokens"]).__name__  # doctest: +SKIP
    ((100, 3), 'RaggedDataset')
    """
    from chute.ray._sink import ChuteDatasink

    if not isinstance(path, (str, os.PathLike)) and isinstance(dataset, (str, os.PathLike)):
        warnings.warn(
            "chute.ray.write_dataset(ray_ds, path) is the old order: pass (path, ray_ds), as "
            "chute.write_dataset takes (path, array)",
            DeprecationWarning,
            stacklevel=3,
        )
        path, dataset = dataset, path
    ray_ds = dataset
    shard_records = check_sharding(shard_records, None)[0] or shard_records
    parse_codec(codec)

    def run(sink: ChuteDatasink) -> None:
        options = ray_ds.context.execution_options
        keep = options.preserve_order
        options.preserve_order = True  # write tasks in row order: task order is shard order
        try:
            ray_ds.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
        finally:
            options.preserve_order = keep

    if not isinstance(path, (str, os.PathLike)) or is_remote_url(path):
        from chute.ray._remote import convert_to_url

        if isinstance(path, (str, os.PathLike)):
            check_options(os.fspath(path), store_options, "write_dataset", _KEYWORDS)
        location = open_location(path, **store_options)
        convert_to_url(
            location, ray_ds, columns=columns, codec=codec, shard_records=shard_records,
            ragged=frozenset(ragged), overwrite=overwrite, run=run, break_lock=break_lock,
        )  # fmt: skip
        return open_columns(path, **store_options)
    check_options(os.fspath(path), store_options, "write_dataset", _KEYWORDS)
    if break_lock:
        raise ValueError("break_lock= is for a conversion into object storage")
    path = Path(path)
    if not overwrite:
        _refuse_occupied(path)  # before even the lock file is made in a folder not ours
    path.mkdir(parents=True, exist_ok=True)
    with conversion_lock(path):  # before anything is removed: a running conversion wins
        if overwrite:
            _remove_conversion(path)
        else:
            _refuse_occupied(path)  # one may have finished while this call took the lock
        run(ChuteDatasink(path, columns, codec, shard_records, frozenset(ragged)))
        return open_columns(path)


def _refuse_occupied(path: Path) -> None:
    if path.is_dir() and any(entry.name != LOCK_FILE for entry in path.iterdir()):
        raise FileExistsError(f"{path} exists and is not empty; pass overwrite=True")


def _remove_conversion(path: Path) -> None:
    """Remove what ``overwrite=True`` replaces at ``path``: columns.json first; a dataset at
    ``path`` itself (sharded, or a single store) as `chute.write_dataset` overwrites one;
    then each column as an overwrite clears a sharded dataset. Each goes under its writer
    lock, its generation raised, so a reader of the old data raises `StoreChangedError`
    instead of reading it on or mixing it with the new."""
    (path / COLUMNS_FILE).unlink(missing_ok=True)
    shutil.rmtree(path / STAGING, ignore_errors=True)
    if is_sharded(path) or (path / META_FILE).exists() or (path / DATASET_LOCK).exists():
        with writer_lock(path):
            clear(path)
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink() and is_sharded(entry):
            with writer_lock(entry):
                clear(entry)


def read_dataset(
    path: str | os.PathLike[str],
    columns: list[str] | None = None,
    *,
    override_num_blocks: int | None = None,
    **read_args: Any,
) -> Any:
    """A converted dataset as a ``ray.data.Dataset``, in the dataset's row order.

    ``path`` is a folder or a URL (``s3://`` ...) as `write_dataset` takes it; of
    ``read_args``, the options of that URL's store (``region=``, ``endpoint=`` ...) go to the
    store (every read task opens the columns with them), the rest to Ray (below).

    Each read task is one contiguous range of record indices (``override_num_blocks`` of
    them; by default one a 64 MiB block of decoded records and at least one a CPU of the
    cluster: each task opens every shard it reads); ``read_args``
    go to ``ray.data.read_datasource`` (``concurrency``, ``num_cpus``, ``ray_remote_args``
    ...). Iterating in order needs Ray's ``DataContext.execution_options.preserve_order =
    True``, as for any source.

    Skipped as a doctest: it starts a Ray cluster (``tests/ray`` runs it on a local one).

    >>> from chute.ray import read_dataset
    >>> ds = read_dataset("/data/conv", columns=["x"], override_num_blocks=4)  # doctest: +SKIP
    >>> ds.count(), ds.take(1)[0]["x"].tolist()  # doctest: +SKIP
    (100, [0, 0, 0])
    """
    import ray.data

    from chute.ray._source import ChuteDatasource

    store_options = {k: v for k, v in read_args.items() if is_option(path, k)}
    read_args = {k: v for k, v in read_args.items() if k not in store_options}
    where = path if reads_remotely(path) else Path(local_path(path))
    source = ChuteDatasource(where, columns, store_options)
    if override_num_blocks is None:
        cpus = int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1  # type: ignore[no-untyped-call]
        override_num_blocks = source.fitting_tasks(cpus)
    return ray.data.read_datasource(source, override_num_blocks=override_num_blocks, **read_args)
