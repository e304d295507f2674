"""Writing a sharded dataset to object storage (``s3://``, ``gs://``, ``az://``, or an obstore
store): the local sharded layout, object for object, committed by its manifest.

Order, for a new dataset, an overwrite and an append alike:

1. take the lock object ``dataset.lock`` (`chute._objects.RemoteLock`: a second writer is
   refused where the store has conditional writes);
2. read ``dataset.json`` (and its ETag) and list the prefix;
3. write each new shard into a local staging folder with the one-store writer, exactly as a
   local shard, and upload its files under ``part-NNNNN.zr/``, numbered from the first number
   above every shard folder there (so no new shard has the name of an old one, committed or
   left by a dead writer); a shard's staged copy is removed once it is up, so the staging
   holds a few shards at a time;
4. put the new ``dataset.json``, conditional on the ETag read in step 2 (on none, where there
   was no manifest): a manifest another writer committed meanwhile is never replaced;
5. delete the shard folders the new manifest does not name (the old dataset's on an
   overwrite, a dead writer's leftovers), then the lock.

Before step 4 the dataset is the old one (or none), whole; a writer killed at any point
leaves the old manifest and its shards untouched, and the next writer removes what it left
(step 5). An append never rewrites a shard: its records go to new shards (so the last shard
of an appended dataset may hold fewer than ``shard_records``, as may any shard before it).
A reader that opened the old manifest reads old shards only: their names are never reused.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Any

from chute._objects import (
    Location,
    RemoteLock,
    Uploads,
    Version,
    delete_keys,
    keys_in,
    list_dir,
    put_always,
    put_object,
    read_object,
    url_of,
)
from chute.datasets._one_store import check_kept_codec, check_write_mode
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import (
    LOCK_FILE,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    Manifest,
    is_shard_name,
    next_shard_number,
    parse_manifest,
)
from chute.datasets._sharded_write import Options, iter_shards, shard_options
from chute.errors import (
    CorruptStoreError,
    RemoteChangedError,
    RemoteError,
    RemoteNotFoundError,
    StoreError,
    StoreKindError,
)
from chute.store._internal import is_store_file


@dataclass(frozen=True)
class Found:
    """What a writer found under the prefix: the manifest and the `Version` it was read at
    (both ``None`` where there is none), and the folders and objects at the top."""

    manifest: Manifest | None
    version: Version | None
    folders: list[str]
    files: list[str]

    @property
    def occupied(self) -> bool:
        """Anything there but a writer's lock."""
        return bool(self.folders) or any(name != LOCK_FILE for name in self.files)


def survey(location: Location, *, replacing: bool = False) -> Found:
    """Read the manifest under ``location`` (checked, with its version) and list the prefix.
    A damaged manifest is a `CorruptStoreError`, unless the caller is ``replacing`` it (then
    it is no manifest, but its version still guards the commit)."""
    stored = read_object(location, MANIFEST_FILE, MAX_MANIFEST_BYTES)
    manifest = None
    if stored is not None:
        try:
            manifest = parse_manifest(stored.data, url_of(location, MANIFEST_FILE))
        except CorruptStoreError:
            if not replacing:
                raise
    folders, files = list_dir(location)
    return Found(manifest, stored.version if stored else None, folders, files)


def check_writable(location: Location) -> None:
    if not location.writable:
        raise RemoteError(
            f"{location.url} is read-only ({location.scheme}://): write datasets to s3://, "
            "gs://, az:// or a local path"
        )


def _refuse_occupied(location: Location, found: Found, mode: str, overwrite: bool) -> None:
    if not found.occupied:
        return
    if mode == "a" and found.manifest is None:
        raise StoreError(
            f"{location.url} holds no sharded dataset to append to (no {MANIFEST_FILE}: a "
            "single store, or a write that did not finish): write it with overwrite=True"
        )
    if not overwrite:
        raise FileExistsError(
            f"{location.url} is not empty; pass mode='a' to append to a dataset there or "
            "overwrite=True to replace what is there"
        )


def write_url(
    location: Location,
    kind: str,
    payloads: Iterable[Any],
    empty: Any,
    *,
    mode: str,
    overwrite: bool,
    shard_records: int,
    workers: int | None,
    options: Options,
    break_lock: bool,
) -> None:
    """A new sharded dataset at ``location`` from ``payloads`` (one per shard; ``empty``
    makes the one shard of an empty dataset): `write_dataset` / `write_ragged` to a URL.
    The caller has sent ``mode="a"`` over an existing manifest to `append_url`."""
    check_write_mode(mode, overwrite)
    check_writable(location)
    _refuse_occupied(location, survey(location, replacing=True), mode, overwrite)  # before a lock
    with RemoteLock(location, LOCK_FILE, break_lock=break_lock) as lock:
        found = survey(location, replacing=True)
        if mode == "a" and found.manifest is not None:
            raise RemoteChangedError(
                f"{location.url}: another writer created a dataset there meanwhile; append again"
            )
        _refuse_occupied(location, found, mode, overwrite)
        it = iter(payloads)
        todo = chain([next(it, empty)], it)
        first = next_shard_number(found.folders)
        shards, schema = _upload_shards(location, lock, kind, todo, first, options, workers)
        assert schema is not None  # there is always a first shard
        manifest = Manifest(schema=schema, shard_records=shard_records, shards=shards)
        _commit(location, lock, found, manifest, replaced=True)


def append_url(
    location: Location,
    kind: str,
    payloads_for: Callable[[Manifest], Iterable[Any]],
    *,
    workers: int | None,
    break_lock: bool,
    shard_records: int | None = None,
    codec: str | None = None,
) -> None:
    """Append to the sharded dataset at ``location``: ``payloads_for(manifest)`` checks the
    records against the dataset and gives a payload per new shard. ``shard_records`` and
    ``codec``, where given, must be the dataset's."""
    check_writable(location)
    with RemoteLock(location, LOCK_FILE, break_lock=break_lock) as lock:
        found = survey(location)
        manifest = found.manifest
        if manifest is None:
            raise RemoteNotFoundError(f"no sharded dataset at {location.url}: no {MANIFEST_FILE}")
        if manifest.schema.ragged != (kind == "ragged"):
            what = "variable-length" if manifest.schema.ragged else "fixed-shape"
            raise StoreKindError(
                f"{location.url} holds {what} records: append with the matching function"
            )
        if shard_records is not None and shard_records != manifest.shard_records:
            raise ValueError(
                f"{location.url} has shard_records={manifest.shard_records}; appending keeps it"
            )
        check_kept_codec(location.url, manifest.schema.codec, codec)
        payloads = payloads_for(manifest)
        first = next_shard_number([*found.folders, *(name for name, _ in manifest.shards)])
        options = shard_options(manifest.schema)
        new, _ = _upload_shards(location, lock, kind, payloads, first, options, workers)
        if new:  # nothing to append: the manifest stays as it is
            grown = replace(manifest, shards=(*manifest.shards, *new))
            _commit(location, lock, found, grown, replaced=False)


def _upload_shards(
    location: Location,
    lock: RemoteLock,
    kind: str,
    payloads: Iterable[Any],
    first: int,
    options: Options,
    workers: int | None,
) -> tuple[tuple[tuple[str, int], ...], RecordSchema | None]:
    """Stage ``payloads`` as shards ``first ...`` in a local folder and upload each as it is
    written; the shards' names and counts, and the first one's schema. On a failure the
    shards begun are deleted again (while the lock is ours), then the failure is raised."""
    shards: list[tuple[str, int]] = []
    schema: RecordSchema | None = None
    with tempfile.TemporaryDirectory(prefix="chute-upload-") as staging:
        uploads = Uploads(location, lock.check, ahead=max(2, workers or 1))
        try:
            for name, n in iter_shards(Path(staging), kind, payloads, first, options, workers):
                if schema is None:
                    schema = RecordSchema.read(Path(staging) / name)
                uploads.add(Path(staging) / name, name)
                shards.append((name, n))
            uploads.finish()
        except BaseException:
            if lock.held:  # else: left for the next writer, which removes unnamed shards
                with contextlib.suppress(RemoteError):
                    uploads.remove_started()
            raise
    return tuple(shards), schema


def _commit(
    location: Location, lock: RemoteLock, found: Found, manifest: Manifest, *, replaced: bool
) -> None:
    """`commit_manifest`, then delete every shard folder ``found`` listed that ``manifest``
    does not name (and, where ``replaced``, a single store's files at the top)."""
    commit_manifest(location, lock, found.version, manifest)
    files = [f for f in found.files if replaced and is_store_file(f)]
    remove_unnamed(location, lock, manifest, found.folders, files)


def commit_manifest(
    location: Location, lock: RemoteLock, over: Version | None, manifest: Manifest
) -> None:
    """Put ``manifest`` as ``dataset.json`` if the one there is still ``over`` (``None``:
    if there is none): the commit point of a write."""
    lock.check()
    data = manifest.to_bytes()
    if not lock.conditional:
        put_always(location, MANIFEST_FILE, data)
        return
    try:
        put_object(location, MANIFEST_FILE, data, over=over)
    except RemoteChangedError:
        raise RemoteChangedError(
            f"{url_of(location, MANIFEST_FILE)} changed since this write began (another "
            "writer committed): this write's shards are left unnamed, for the next writer "
            "to remove"
        ) from None


def remove_unnamed(
    location: Location,
    lock: RemoteLock,
    manifest: Manifest,
    folders: Iterable[str],
    files: Iterable[str] = (),
) -> None:
    """After a commit: delete the shard ``folders`` that ``manifest`` does not name (an old
    dataset's, a dead writer's), and ``files``, while the lock is still this writer's."""
    named = {name for name, _ in manifest.shards}
    gone = [f for f in folders if is_shard_name(f) and f not in named]
    lock.check()
    delete_keys(location, [*keys_in(location, gone), *files])
