"""Converting a Ray Dataset into object storage: the column layout of a local conversion
(``columns.json``, one sharded dataset per column), object for object.

Order:

1. the driver takes the lock object ``columns.lock`` (a second conversion is refused where
   the store has conditional writes), reads each old column's ``dataset.json`` (and its
   ETag) and lists its shards;
2. the write tasks stage their shards locally and upload each at once (`chute.ray._sink`),
   under numbers above every shard there, so the old conversion stays whole and readable;
3. once every task has succeeded, the driver deletes ``columns.json`` (from here to step 4
   a reader of the conversion finds it unfinished, `IncompleteDatasetError`, never columns
   of two conversions mixed), puts each column's ``dataset.json`` conditional on the ETag
   read in step 1, then ``columns.json``;
4. it deletes what no manifest names: the old shards, a retried task's leftovers, the old
   columns the new conversion lacks; then the lock.

A dataset at the root itself (``overwrite=True`` over a plain sharded dataset) loses its
``dataset.json`` with ``columns.json`` in step 3 and its shards in step 4.

A conversion that fails before step 3 leaves the old one as it was, and the driver deletes
what its tasks uploaded (numbers from its base up), lock in hand; a killed driver's uploads
are deleted by the next conversion, in step 4.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from chute._objects import (
    Location,
    RemoteLock,
    delete_keys,
    keys_in,
    list_dir,
    put_always,
    put_object,
    sub_location,
)
from chute.datasets._internal import (
    MANIFEST_FILE,
    Found,
    Manifest,
    check_writable,
    commit_manifest,
    is_shard_name,
    next_shard_number,
    remove_unnamed,
    survey,
)
from chute.errors import RemoteError
from chute.ray._layout import (
    COLUMNS_FILE,
    LOCK_FILE,
    columns_bytes,
)
from chute.ray._sink import TASK_SHARDS, ChuteDatasink, Remote
from chute.store._internal import is_store_file


def convert_to_url(
    location: Location,
    ray_ds: Any,
    *,
    columns: list[str] | None,
    codec: str,
    shard_records: int,
    ragged: frozenset[str],
    overwrite: bool,
    run: Any,
    break_lock: bool,
) -> None:
    """`chute.ray.write_dataset` into object storage; ``run(sink)`` runs the Ray write."""
    check_writable(location)
    if not hasattr(location.store, "config"):
        raise TypeError(
            f"{type(location.store).__name__} lives in one process: Ray's write tasks cannot "
            "reach it; convert to s3://, gs:// or az://"
        )
    _refuse_occupied(location, overwrite)  # before a lock is put in a folder not ours
    with RemoteLock(location, LOCK_FILE, break_lock=break_lock) as lock:
        _refuse_occupied(location, overwrite)
        root = survey(location, replacing=True)  # a dataset there is replaced too
        old = {
            name: survey(sub_location(location, name), replacing=True)
            for name in root.folders
            if not is_shard_name(name)
        }
        base = next_shard_number(f for found in old.values() for f in found.folders)
        base = -(-base // TASK_SHARDS) * TASK_SHARDS  # a whole block of numbers per task
        remote = Remote(location, base)
        sink = ChuteDatasink(Path(location.url), columns, codec, shard_records, ragged, remote)
        try:
            run(sink)
        except BaseException:
            if lock.held:  # else: left for the next conversion, which removes them
                with contextlib.suppress(RemoteError):
                    _remove_from(location, base)
            raise
        _commit(location, lock, sink, old, root)


def _refuse_occupied(location: Location, overwrite: bool) -> None:
    folders, files = list_dir(location)
    if not overwrite and (folders or any(name != LOCK_FILE for name in files)):
        raise FileExistsError(f"{location.url} is not empty; pass overwrite=True")


def _commit(
    location: Location,
    lock: RemoteLock,
    sink: ChuteDatasink,
    old: dict[str, Found],
    root: Found,
) -> None:
    """Steps 3 and 4; a dataset at the root itself (``root``: its manifest, shards, a single
    store's files) loses its manifest with columns.json and its shards at the end."""
    lock.check()
    delete_keys(location, [COLUMNS_FILE, *([MANIFEST_FILE] if MANIFEST_FILE in root.files else [])])
    manifests: dict[str, Manifest] = {}
    for name, (_, schema, shards) in sink.uploaded.items():
        manifest = Manifest(
            schema=schema.with_codec(sink.codec),
            shard_records=sink.rows_per_shard,
            shards=tuple(shards),
        )
        found = old.get(name)
        over = found.version if found is not None else None
        commit_manifest(sub_location(location, name), lock, over, manifest)
        manifests[name] = manifest
    kinds = [(name, kind) for name, (kind, _, _) in sink.uploaded.items()]
    data = columns_bytes(kinds, sink.records)
    lock.check()
    if lock.conditional:
        put_object(location, COLUMNS_FILE, data, over=None)
    else:
        put_always(location, COLUMNS_FILE, data)
    for name, manifest in manifests.items():
        folder = sub_location(location, name)
        remove_unnamed(folder, lock, manifest, list_dir(folder)[0])
    gone = [name for name, found in old.items() if name not in manifests and _is_column(found)]
    gone += [f for f in root.folders if is_shard_name(f) and f not in manifests]
    lock.check()
    delete_keys(location, [*keys_in(location, gone), *filter(is_store_file, root.files)])


def _is_column(found: Found) -> bool:
    """Whether a folder at the root holds a sharded dataset (a column), finished or not."""
    return found.manifest is not None or any(f.startswith("part-") for f in found.folders)


def _remove_from(location: Location, base: int) -> None:
    """Delete every shard numbered ``base`` or above, in every folder at the root: what the
    tasks of a failed conversion uploaded."""
    for name in list_dir(location)[0]:
        folder = sub_location(location, name)
        ours = [f for f in list_dir(folder)[0] if next_shard_number([f]) > base]  # >= base
        delete_keys(folder, keys_in(folder, ours))
