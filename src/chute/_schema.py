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
from chute.store._format import SCHEMA_FILE
from chute.store._io import write_file_atomic

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
    return doc
