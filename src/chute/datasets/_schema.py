"""schema.json: the per-record dtype and shape a dataset layer keeps beside a store.

The keys follow loaderx's layout (``format``, ``version``, ``dtype``, ``shape``, ``codec``,
plus ``ragged`` and ``item_shape`` for variable-length stores), so either side opens
the other's datasets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from chute._util.safe_open import read_regular
from chute.errors import CorruptStoreError, StoreNotFoundError
from chute.store._internal import SCHEMA_FILE, write_file_atomic

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
