"""The column layout Ray conversions write: one sharded dataset per column, and columns.json.

::

    path/
      columns.json        the commit point, written last (below)
      image/              a sharded dataset (dataset.json, part-00000.zr ...) of fixed rows
      label/              likewise
      tokens/             a sharded dataset of variable-length records (RaggedDataset)

columns.json is UTF-8 JSON: ``format`` ("chute-columns"), ``version`` (1), ``records``
(every column's length), ``columns`` ([{"name": ..., "kind": "fixed" | "ragged"}, ...] in
the source's column order) and ``checksum``, computed as in dataset.json. This module needs
no Ray: chute reads a converted dataset on any machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from chute._objects import (
    Location,
    check_options,
    list_dir,
    local_path,
    open_location,
    read_object,
    reads_remotely,
    sub_location,
    url_of,
)
from chute._util.fs import held_lock, write_file_atomic
from chute._util.renamed import legacy_arguments
from chute._util.safe_open import read_regular
from chute.datasets import Dataset, RaggedDataset
from chute.datasets._internal import checksum_of
from chute.errors import (
    ColumnTypeError,
    CorruptStoreError,
    IncompleteDatasetError,
    RemoteNotFoundError,
    StoreNotFoundError,
)

COLUMNS_FILE: Final = "columns.json"
MAX_COLUMNS_BYTES: Final = 16 << 20  # names and kinds of columns: far less in any real file
#: Held (flock) by the driver for a whole conversion into the folder; never removed.
LOCK_FILE: Final = "columns.lock"
FORMAT: Final = "chute-columns"
VERSION: Final = 1
STAGING: Final = ".staging"
KINDS: Final = ("fixed", "ragged")
#: open_columns' own keywords, named when a store option is misspelt.
_KEYWORDS = ("columns", "verify", "num_threads")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def check_column_name(name: str) -> str:
    """A column name is also a directory name: letters, digits, ``_ . -``, no leading dot."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"column name {name!r} cannot name a directory: use letters, digits and _ . -"
        )
    return name


def conversion_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the folder's conversion lock for the block: a second conversion into ``path``
    (another thread or process) gets `StoreLockedError` before it removes or writes
    anything, and the first runs on intact."""
    return held_lock(path / LOCK_FILE, path)


def check_column_types(name: str, arrays: Iterable[npt.NDArray[Any]]) -> None:
    """Refuse a column whose arrays (the blocks of a fixed-shape column, the rows of a ragged
    one) are of more than one dtype: joined, numpy would promote them (int64 and float64 to
    float64, losing integers above 2**53). Ray's empty ragged rows (object arrays) have no
    type of their own and are skipped."""
    first: np.dtype[Any] | None = None
    for array in arrays:
        if array.dtype == object:
            continue
        if first is None:
            first = array.dtype
        elif array.dtype != first:
            raise ColumnTypeError(
                f"column {name!r} changes type across blocks: {first} then {array.dtype}"
            )


def columns_bytes(columns: list[tuple[str, str]], records: int) -> bytes:
    """columns.json's bytes for ``(name, kind)`` columns of ``records`` records each."""
    fields = {
        "format": FORMAT,
        "version": VERSION,
        "records": records,
        "columns": [{"name": name, "kind": kind} for name, kind in columns],
    }
    doc = {**fields, "checksum": checksum_of(fields)}
    return json.dumps(doc, indent=2).encode() + b"\n"


def write_columns(path: Path, columns: list[tuple[str, str]], records: int) -> None:
    write_file_atomic(path / COLUMNS_FILE, columns_bytes(columns, records))


def read_columns(path: Any, **store_options: Any) -> tuple[list[tuple[str, str]], int]:
    """The ``(name, kind)`` columns and the record count of a converted dataset: a folder,
    or a URL (``s3://`` ..., with ``store_options``) or obstore store."""
    return _read_at(_where(path, store_options, "read_columns"))


def _where(path: Any, store_options: dict[str, Any], owner: str) -> Path | Location:
    """The folder, or the `Location` in object storage, ``path`` names (options checked)."""
    if isinstance(path, (str, os.PathLike)):
        check_options(os.fspath(path), store_options, owner, _KEYWORDS)
        if not reads_remotely(path):
            return Path(local_path(path))
    return open_location(path, **store_options)


def _read_at(where: Path | Location) -> tuple[list[tuple[str, str]], int]:
    if isinstance(where, Location):
        file = url_of(where, COLUMNS_FILE)
        stored = read_object(where, COLUMNS_FILE, MAX_COLUMNS_BYTES)
        if stored is None:
            folders, files = list_dir(where)
            if folders or any(name != LOCK_FILE for name in files):
                raise IncompleteDatasetError(
                    f"{where.url} has no {COLUMNS_FILE}: its conversion did not finish"
                )
            raise RemoteNotFoundError(f"no converted dataset at {where.url}: no {file}")
        return parse_columns(stored.data, file)
    file_path = where / COLUMNS_FILE
    try:
        raw = read_regular(file_path, where, MAX_COLUMNS_BYTES)
    except FileNotFoundError:
        if where.is_dir() and any(where.iterdir()):
            raise IncompleteDatasetError(
                f"{where} has no {COLUMNS_FILE}: its conversion did not finish"
            ) from None
        raise StoreNotFoundError(f"no converted dataset at {where}: no {COLUMNS_FILE}") from None
    return parse_columns(raw, str(file_path))


def parse_columns(raw: bytes, file: str) -> tuple[list[tuple[str, str]], int]:
    """columns.json's bytes (from a folder or object storage) checked: format, version, its
    own checksum, the column names; ``file`` names it in every error."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptStoreError(f"{file} is not valid JSON: {e}") from None
    except RecursionError:
        raise CorruptStoreError(f"{file} nests deeper than a column list does") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CorruptStoreError(f"{file} is not a {FORMAT} v{VERSION} file")
    fields = {k: v for k, v in doc.items() if k != "checksum"}
    if doc.get("checksum") != checksum_of(fields):
        raise CorruptStoreError(f"{file} does not match its own checksum: it is damaged")
    listed, records = doc.get("columns"), doc.get("records")
    if type(records) is not int or records < 0:  # not a bool, a float or a string
        raise CorruptStoreError(f"{file}: 'records' is {records!r}, not a count")
    if not isinstance(listed, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and c.get("kind") in KINDS
        for c in listed
    ):
        raise CorruptStoreError(f"{file}: 'columns' is not a list of names and kinds")
    try:
        return [(check_column_name(c["name"]), c["kind"]) for c in listed], records
    except ValueError as e:
        raise CorruptStoreError(f"{file}: {e}") from None


@legacy_arguments(renamed={"threads": "num_threads"})
def open_columns(
    path: Any,
    columns: list[str] | None = None,
    *,
    verify: bool = False,
    num_threads: int | None = None,
    **store_options: Any,
) -> dict[str, Dataset | RaggedDataset]:
    """A converted dataset's columns opened with chute, ready as `chute.DataLoader` streams.

    ``path`` is a folder, or a URL (``s3://``, ``gs://``, ``az://`` ..., with
    ``store_options`` as `chute.Dataset` takes them) or an obstore store: each column opens
    as a `chute.Dataset` or `chute.RaggedDataset` of ``path/<column>``.

    >>> import tempfile, numpy as np, chute
    >>> from chute.ray._layout import write_columns
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = chute.write_dataset(root / "label", np.arange(3), shard_records=2)
    >>> write_columns(root, [("label", "fixed")], 3)
    >>> open_columns(root)["label"][:].tolist()
    [0, 1, 2]
    """
    where = _where(path, store_options, "open_columns")
    kinds, records = _read_at(where)
    known = dict(kinds)
    names = [name for name, _ in kinds] if columns is None else list(columns)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise KeyError(f"{_shown(where)} has no columns {unknown}; it has {list(known)}")
    opened: dict[str, Dataset | RaggedDataset] = {}
    try:
        for name in names:
            view = Dataset if known[name] == "fixed" else RaggedDataset
            opened[name] = view(
                _column(where, name), verify=verify, num_threads=num_threads, **store_options
            )
            if len(opened[name]) != records:
                raise CorruptStoreError(
                    f"{_shown(where)}/{name} holds {len(opened[name])} records; "
                    f"{COLUMNS_FILE} says {records}"
                )
    except BaseException:
        for ds in opened.values():
            ds.close()
        raise
    return opened


def _shown(where: Path | Location) -> str:
    return where.url.rstrip("/") if isinstance(where, Location) else str(where)


def _column(where: Path | Location, name: str) -> Any:
    """What `chute.Dataset` opens for column ``name``: its folder, its URL, or (under a
    store instance) the store rooted at it."""
    if not isinstance(where, Location):
        return where / name
    if where.scheme == "memory":
        return sub_location(where, name).store
    return url_of(where, name)
