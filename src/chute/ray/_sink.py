"""Converting a Ray Dataset: a Ray `Datasink` whose write tasks each write whole shards.

Each write task (one group of Ray blocks, at least ``rows_per_shard`` rows, Ray's own
bundling) writes its shards under ``path/.staging/<task>-<attempt id>/<column>/``. Nothing
there is part of any dataset. Only when every task has succeeded does the driver, in
``on_write_complete``, move the shards of the tasks Ray reported as done, in task order
(the dataset's row order), into ``path/<column>/part-NNNNN.zr``, write each column's
manifest, then ``columns.json`` (the commit point), then remove the staging area, and with
it whatever a failed or retried attempt had written.

Into object storage (`Remote`), a task writes each shard into a local temporary folder and
uploads it at once under ``<column>/part-NNNNN.zr``, numbered ``base + task * 10**6 + k``
(``base`` above every shard number there before): a retried task writes the same names
again, no two tasks share one, and no name of the old dataset is reused. The driver then
commits, as `chute.ray._remote` describes.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from chute._objects import Location, sub_location, upload_folder
from chute.datasets import write_dataset, write_ragged
from chute.datasets._internal import (
    Manifest,
    RecordSchema,
    shard_name,
    write_manifest,
    writer_lock,
)
from chute.errors import ColumnTypeError
from chute.ray._layout import STAGING, check_column_name, check_column_types, write_columns

# A column's rows: one array (fixed shape), or a list of row arrays (ragged).
Column = npt.NDArray[Any] | list[npt.NDArray[Any]]

#: Shards one write task may write into object storage (its block of shard numbers).
TASK_SHARDS = 10**6


@dataclass(frozen=True)
class Remote:
    """A conversion into object storage: the root `Location` and the first shard number."""

    location: Location
    base: int

    def shard(self, task: int, k: int) -> str:
        """The name of write task ``task``'s ``k``-th shard (the same for each attempt)."""
        if k >= TASK_SHARDS:
            raise ValueError(
                f"write task {task} holds more than {TASK_SHARDS} shards: raise shard_records"
            )
        return shard_name(self.base + task * TASK_SHARDS + k)


class ChuteDatasink(Datasink[dict[str, Any]]):  # type: ignore[misc]
    """Writes a Ray Dataset's columns as chute sharded datasets (see `chute.ray`)."""

    def __init__(
        self,
        path: Path,
        columns: list[str] | None,
        codec: str,
        rows_per_shard: int,
        ragged: frozenset[str],
        remote: Remote | None = None,
    ) -> None:
        self.path = path
        self.remote = remote
        self.columns = columns
        self.codec = codec
        self.rows_per_shard = rows_per_shard
        self.ragged = ragged
        #: After a write, on the driver: the rows of each shard, per write task in order.
        self.tasks: list[list[int]] = []
        #: After a write into object storage, on the driver: each column's kind, schema and
        #: shards in row order, for `chute.ray._remote` to commit; and the record count.
        self.uploaded: dict[str, tuple[str, RecordSchema, list[tuple[str, int]]]] = {}
        self.records = 0

    @property
    def min_rows_per_write(self) -> int:
        return self.rows_per_shard

    def get_name(self) -> str:
        return "ChuteWrite"

    def on_write_start(self, schema: Any = None) -> None:
        if self.remote is None:
            (self.path / STAGING).mkdir(parents=True, exist_ok=True)

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        """One write task: its blocks, cut into shards of ``rows_per_shard`` rows."""
        index = int(ctx.task_idx)
        with contextlib.ExitStack() as stack:
            if self.remote is None:
                staging = self.path / STAGING / f"{index:08d}-{uuid.uuid4().hex}"
            else:  # a local folder: each shard goes up as soon as it is written
                staging = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chute-")))
            task = _TaskWriter(self, staging, index)
            for block in blocks:
                task.add(BlockAccessor.for_block(block).to_batch_format("numpy"))
            task.flush(final=True)
        return {
            "task": index,
            "staging": staging.name,
            "shards": task.shards,
            "kinds": task.kinds,
            "schemas": task.schemas,
        }

    def on_write_complete(self, write_result: Any) -> None:
        results = sorted(
            (r for r in write_result.write_returns if r["shards"]), key=lambda r: r["task"]
        )
        if not results:
            raise ValueError("the Ray dataset has no rows: there is nothing to convert")
        self.tasks = [r["shards"] for r in results]
        columns = list(results[0]["kinds"])
        for r in results:
            if r["kinds"] != results[0]["kinds"]:
                diff = sorted(k for k in columns if r["kinds"].get(k) != results[0]["kinds"][k])
                raise ColumnTypeError(
                    f"columns {diff} hold fixed-shape rows in some blocks and variable-length "
                    "rows in others: name them in ragged=[...] to store them as ragged"
                )
        records = sum(sum(r["shards"]) for r in results)
        if self.remote is not None:  # the driver commits (chute.ray._remote), lock in hand
            for name in columns:
                schemas = [
                    RecordSchema.from_fields(f, name) for r in results for f in r["schemas"][name]
                ]
                shards = [
                    (self.remote.shard(r["task"], k), n)
                    for r in results
                    for k, n in enumerate(r["shards"])
                ]
                self.uploaded[name] = (
                    results[0]["kinds"][name],
                    _one_schema(name, schemas),
                    shards,
                )
            self.records = records
            return
        staged = {name: self._staged(name, results) for name in columns}  # all checked first
        for name, (schema, parts) in staged.items():
            self._commit_column(name, schema, parts)
        write_columns(self.path, [(name, results[0]["kinds"][name]) for name in columns], records)
        shutil.rmtree(self.path / STAGING, ignore_errors=True)

    def _staged(
        self, name: str, results: list[dict[str, Any]]
    ) -> tuple[RecordSchema, list[tuple[Path, int]]]:
        """A column's staged shards in row order, and the schema every one of them has:
        shards that differ (blocks of another type in another write task) are an error
        before any shard is moved."""
        parts = [
            (self.path / STAGING / r["staging"] / name / f"{k:05d}.zr", n)
            for r in results
            for k, n in enumerate(r["shards"])
        ]
        return _one_schema(name, [RecordSchema.read(part) for part, _ in parts]), parts

    def _commit_column(
        self, name: str, schema: RecordSchema, parts: list[tuple[Path, int]]
    ) -> None:
        target = self.path / name
        target.mkdir(exist_ok=True)
        with writer_lock(target):
            shards: list[tuple[str, int]] = []
            for part, n in parts:
                part.rename(target / shard_name(len(shards)))
                shards.append((shard_name(len(shards)), n))
            write_manifest(
                target,
                Manifest(
                    schema=schema.with_codec(self.codec),
                    shard_records=self.rows_per_shard,
                    shards=tuple(shards),
                ),
            )

    def on_write_failed(self, error: Exception) -> None:
        if self.remote is None:
            shutil.rmtree(self.path / STAGING, ignore_errors=True)


def _one_schema(name: str, schemas: Iterable[RecordSchema]) -> RecordSchema:
    """The schema every shard of column ``name`` has: shards that differ (blocks of another
    type in another write task) are an error before any shard is committed."""
    first: RecordSchema | None = None
    for schema in schemas:
        if first is None:
            first = schema
        elif not schema.same_records(first):
            raise ColumnTypeError(
                f"column {name!r} changes type across blocks: {first.describe()} "
                f"then {schema.describe()}"
            )
    assert first is not None
    return first


class _TaskWriter:
    """Buffers one task's batches and writes a shard per ``rows_per_shard`` rows."""

    def __init__(self, sink: ChuteDatasink, staging: Path, task: int) -> None:
        self.sink = sink
        self.staging = staging
        self.task = task
        self.schemas: dict[str, list[dict[str, Any]]] = {}  # each uploaded shard's, by column
        self.folders: dict[str, Location] = {}  # each column's folder in object storage
        self.pending: list[Mapping[str, Column]] = []  # batches not yet in a shard
        self.rows = 0
        self.shards: list[int] = []
        self.kinds: dict[str, str] = {}

    def add(self, batch: dict[str, npt.NDArray[Any]]) -> None:
        names = self.sink.columns if self.sink.columns is not None else list(batch)
        missing = [name for name in names if name not in batch]
        if missing:
            raise KeyError(f"the Ray dataset has no columns {missing}; it has {list(batch)}")
        picked = {check_column_name(name): batch[name] for name in names}
        for name, values in picked.items():
            _refuse_strings(name, values)
            kind = "ragged" if values.dtype == object or name in self.sink.ragged else "fixed"
            if self.kinds.setdefault(name, kind) != kind:
                raise ColumnTypeError(
                    f"column {name!r} holds fixed-shape rows in some blocks and variable-length "
                    "rows in others: name it in ragged=[...] to store it as ragged"
                )
        self.pending.append(picked)
        self.rows += len(next(iter(picked.values()))) if picked else 0
        self.flush(final=False)

    def flush(self, final: bool) -> None:
        size = self.sink.rows_per_shard
        if not self.pending or (self.rows < size and not final) or self.rows == 0:
            return
        whole = {
            name: _concat(name, [p[name] for p in self.pending], self.kinds[name] == "ragged")
            for name in self.pending[0]
        }
        start = 0
        while self.rows - start >= size or (final and start < self.rows):
            stop = min(start + size, self.rows)
            for name, values in whole.items():
                self._write(name, values[start:stop])
            self.shards.append(stop - start)
            start = stop
        self.pending = [{name: values[start:] for name, values in whole.items()}]
        self.rows -= start
        if self.rows == 0:
            self.pending = []

    def _write(self, name: str, values: Column) -> None:
        part = self.staging / name / f"{len(self.shards):05d}.zr"
        part.parent.mkdir(parents=True, exist_ok=True)
        codec = self.sink.codec
        if not isinstance(values, list):
            write_dataset(part, values, codec=codec, progress=False).close()
        else:
            typed = [r for r in values if r.dtype != object]
            if len(typed) < len(values):  # Ray hands empty rows back as empty object arrays
                dtype = typed[0].dtype if typed else np.dtype(np.float64)
                tail = typed[0].shape[1:] if typed else ()
                values = [r if r.dtype != object else np.zeros((0, *tail), dtype) for r in values]
            write_ragged(part, values, codec=codec).close()
        remote = self.sink.remote
        if remote is not None:
            if name not in self.folders:
                self.folders[name] = sub_location(remote.location, name)
            self.schemas.setdefault(name, []).append(RecordSchema.read(part).to_fields())
            upload_folder(self.folders[name], part, remote.shard(self.task, len(self.shards)))
            shutil.rmtree(part)


def _refuse_strings(name: str, values: npt.NDArray[Any]) -> None:
    """A column of strings (numpy ``U``/``S``, or Python ``str``/``bytes`` objects) is a
    `ColumnTypeError` saying so: their widths vary from block to block, and chute stores
    numbers."""
    kind = values.dtype.kind
    if kind == "O":  # ragged rows: look at a few of them
        kinds = {"S" if isinstance(v, (str, bytes)) else np.asarray(v).dtype.kind
                 for v in values.reshape(-1)[:64]}  # fmt: skip
        kind = "S" if kinds & set("US") else kind
    if kind in "US":
        raise ColumnTypeError(
            f"column {name!r} holds strings: string columns are not supported; encode them "
            "as numbers in the source (token ids, uint8 bytes) or leave the column out "
            "(columns=[...])"
        )


def _concat(name: str, parts: list[Column], ragged: bool) -> Column:
    """One column's rows from several batches: a list of row arrays for a ragged column
    (Ray hands its blocks over as object arrays, or as 2-D arrays of different widths
    where a block's rows happen to be of one length), else one array."""
    if ragged:
        rows = [np.asarray(row) for p in parts for row in p]
        check_column_types(name, rows)
        return rows
    fixed = [np.asarray(p) for p in parts]
    check_column_types(name, fixed)
    if len(fixed) == 1:
        return fixed[0]
    shapes = {p.shape[1:] for p in fixed}
    if len(shapes) > 1:
        raise ColumnTypeError(
            f"column {name!r} holds rows of shapes {sorted(shapes)} in different blocks: "
            "name it in ragged=[...] to store it as ragged"
        )
    return np.concatenate(fixed)
