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

from chute.errors import CorruptStoreError, StoreNotFoundError
from chute.store._internal import SCHEMA_FILE, write_file_atomic

SCHEMA_FORMAT = "loaderx-zrecord"
SCHEMA_VERSION = 1


def write_schema(path: Path, fields: dict[str, Any]) -> None:
    doc = {"format": SCHEMA_FORMAT, "version": SCHEMA_VERSION, **fields}
    write_file_atomic(path / SCHEMA_FILE, json.dumps(doc, indent=2).encode() + b"\n")


def read_schema(path: Path) -> dict[str, Any]:
    """Load and check schema.json; every failure names the file and the problem."""
    file = path / SCHEMA_FILE
    try:
        doc = json.loads(file.read_bytes())
    except FileNotFoundError:
        if not path.exists():
            raise StoreNotFoundError(f"no dataset at {path}: the path does not exist") from None
        raise StoreNotFoundError(f"{path} has no schema.json: not a dataset") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptStoreError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or "dtype" not in doc:
        raise CorruptStoreError(f"{file} does not describe a dataset (no 'dtype')")
    try:
        doc["dtype"] = np.dtype(doc["dtype"])
        for key in ("shape", "item_shape"):
            if key in doc:
                doc[key] = tuple(int(d) for d in doc[key])
    except (TypeError, ValueError) as e:
        raise CorruptStoreError(f"{file}: bad dtype or shape: {e}") from None
    try:
        check_plain_dtype(doc["dtype"])
    except TypeError as e:
        raise CorruptStoreError(f"{file}: {e}") from None
    if any(d < 0 for key in ("shape", "item_shape") for d in doc.get(key, ())):
        raise CorruptStoreError(f"{file}: a negative dimension in the record shape")
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
