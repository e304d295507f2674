"""schema.json: the per-record dtype and shape a dataset layer keeps beside a store.

The keys follow loaderx's layout (``format``, ``version``, ``dtype``, ``shape``, ``codec``,
plus ``ragged`` and ``item_shape`` for variable-length stores), so either side opens
the other's datasets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np

from chute._util.safe_open import read_regular
from chute.errors import (
    CorruptStoreError,
    SchemaMismatchError,
    StoreKindError,
    StoreNotFoundError,
)
from chute.store import Codec, RecordStore
from chute.store._internal import SCHEMA_FILE, codec_name, parse_codec, write_file_atomic

SCHEMA_FORMAT = "loaderx-zrecord"
SCHEMA_VERSION = 1
MAX_SCHEMA_BYTES = 1 << 20  # a dtype, a shape and a codec: far less in any real schema.json


def write_schema(path: Path, fields: dict[str, Any]) -> None:
    doc = {"format": SCHEMA_FORMAT, "version": SCHEMA_VERSION, **fields}
    write_file_atomic(path / SCHEMA_FILE, json.dumps(doc, indent=2).encode() + b"\n")


def read_schema(path: Path) -> dict[str, Any]:
    """Load and check schema.json; every failure names the file and the problem."""
    file = path / SCHEMA_FILE
    if path.is_file():
        raise StoreNotFoundError(
            f"{path} is a file, not a chute store (a store is a directory written by "
            "chute.write_dataset or write_ragged); convert an array with write_dataset"
        )
    try:
        doc = json.loads(read_regular(file, path, MAX_SCHEMA_BYTES))
    except FileNotFoundError:
        if not path.exists():
            raise StoreNotFoundError(f"no dataset at {path}: the path does not exist") from None
        raise StoreNotFoundError(f"{path} has no schema.json: not a dataset") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptStoreError(f"{file} is not valid JSON: {e}") from None
    except RecursionError:
        raise CorruptStoreError(f"{file} nests deeper than a schema does") from None
    return parse_schema(doc, str(file))


def parse_schema(doc: Any, where: str) -> dict[str, Any]:
    """Check a schema document (schema.json's, or a sharded manifest's) and type its fields."""
    if not isinstance(doc, dict) or "dtype" not in doc:
        raise CorruptStoreError(f"{where} does not describe a dataset (no 'dtype')")
    try:
        doc["dtype"] = np.dtype(doc["dtype"])
        for key in ("shape", "item_shape"):
            if key in doc:
                doc[key] = tuple(int(d) for d in doc[key])
    except (TypeError, ValueError) as e:
        raise CorruptStoreError(f"{where}: bad dtype or shape: {e}") from None
    try:
        check_plain_dtype(doc["dtype"])
    except TypeError as e:
        raise CorruptStoreError(f"{where}: {e}") from None
    if any(d < 0 for key in ("shape", "item_shape") for d in doc.get(key, ())):
        raise CorruptStoreError(f"{where}: a negative dimension in the record shape")
    return doc


def check_plain_dtype(dtype: np.dtype[Any]) -> None:
    """Refuse a dtype whose bytes are not plain data: Python objects (``"|O"``, or a
    structured dtype with an object field) and numpy's variable-width strings hold pointers,
    which are meaningless once stored and crash the interpreter when read back as records.

    >>> check_plain_dtype(np.dtype("<f4"))  # fine: plain data
    >>> check_plain_dtype(np.dtype([("a", "<f4"), ("b", "O")]))
    Traceback (most recent call last):
    TypeError: dtype [('a', '<f4'), ('b', 'O')] holds Python objects or pointers; ...
    """
    if dtype.hasobject or dtype.kind == "T":
        raise TypeError(
            f"dtype {dtype} holds Python objects or pointers; only plain dtypes can be stored"
        )


WriteMode = Literal["w", "a"]
"""``"w"`` writes a new store (an existing one only with ``overwrite=True``); ``"a"`` appends."""

_KEYS = ("ragged", "dtype", "shape", "item_shape")


def _describe(doc: dict[str, Any]) -> str:
    shape = doc.get("item_shape", doc.get("shape", ()))
    kind = "variable-length " if doc.get("ragged") else ""
    return f"{kind}{np.dtype(doc['dtype'])} records of shape {tuple(shape)}"


def open_for_writing(
    path: Path,
    fields: dict[str, Any],
    *,
    mode: WriteMode,
    overwrite: bool,
    codec: str | None,
    level: int | None,
) -> tuple[RecordStore, Codec]:
    """The store at ``path`` open for appending records described by ``fields``, and its codec.

    A new store gets ``fields`` (and the codec) as its schema.json. With ``mode="a"`` an
    existing store must have the same kind, dtype and record shape, and keeps its codec.
    """
    if mode not in ("w", "a"):
        raise ValueError(f"mode must be 'w' (write a new store) or 'a' (append), got {mode!r}")
    if mode == "a" and overwrite:
        raise ValueError("overwrite=True replaces the store and mode='a' appends to it: pick one")
    fresh = not path.exists() or (path.is_dir() and not any(path.iterdir()))
    if mode == "a" and not fresh:
        existing = read_schema(path)
        ours = {**fields, "dtype": np.dtype(fields["dtype"])}
        if bool(existing.get("ragged")) != bool(fields.get("ragged")):
            opener = "write_ragged" if existing.get("ragged") else "write_dataset"
            raise StoreKindError(f"{path} holds {_describe(existing)}: append with {opener}")
        if any(existing.get(k) != (tuple(v) if isinstance(v, list) else v)
               for k, v in ours.items() if k in _KEYS):  # fmt: skip
            raise SchemaMismatchError(
                f"{path} holds {_describe(existing)}; cannot append {_describe(fields)}"
            )
        stored = str(existing.get("codec", "zstd"))
        if codec is not None and codec_name(parse_codec(codec)) != stored:
            raise ValueError(
                f"{path} is written with codec {stored!r}; appending keeps it (leave codec= out)"
            )
        c = parse_codec(stored)
        return RecordStore(path, mode="a", codec=c, level=level), c
    if not fresh and not overwrite:
        raise FileExistsError(
            f"{path} exists and is not empty; pass mode='a' to append to it or overwrite=True "
            "to replace it"
        )
    c = parse_codec("zstd" if codec is None else codec)
    store = RecordStore(path, mode="w", codec=c, level=level)
    try:
        write_schema(path, {**fields, "codec": codec_name(c)})
    except BaseException:
        store.close()
        raise
    return store, c
