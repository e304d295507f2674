"""schema.json: the per-record dtype and shape a dataset layer keeps beside a store.

The keys follow loaderx's layout (``format``, ``version``, ``dtype``, ``shape``, ``codec``,
plus ``ragged`` and ``item_shape`` for variable-length stores), so either side opens
the other's datasets. `RecordSchema` is the one reader and writer of those keys: every
other module holds the value, never the dict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from chute._util.safe_open import read_regular
from chute.errors import CorruptStoreError, StoreNotFoundError
from chute.store._internal import SCHEMA_FILE, write_file_atomic

SCHEMA_FORMAT = "loaderx-zrecord"
SCHEMA_VERSION = 1
MAX_SCHEMA_BYTES = 1 << 20  # a dtype, a shape and a codec: far less in any real schema.json


@dataclass(frozen=True, kw_only=True)
class RecordSchema:
    """What a dataset's records are: a dtype, the shape of one record (of one row, for
    variable-length records, ``ragged``), and the codec they were written with.

    >>> s = RecordSchema(dtype=np.dtype("<f4"), item_shape=(3,))
    >>> s.to_fields(), s.describe()
    ({'dtype': '<f4', 'shape': [3], 'codec': 'zstd'}, 'float32 records of shape (3,)')
    >>> RecordSchema.from_fields(s.to_fields(), "here") == s
    True
    """

    dtype: np.dtype[Any]
    item_shape: tuple[int, ...] = ()
    ragged: bool = False
    codec: str = "zstd"

    @property
    def kind(self) -> str:
        """``"ragged"`` or ``"fixed"``."""
        return "ragged" if self.ragged else "fixed"

    @property
    def item_bytes(self) -> int:
        """Bytes of one record (of one row, for variable-length records)."""
        return self.dtype.itemsize * math.prod(self.item_shape)

    def describe(self) -> str:
        """The records in words, for messages."""
        kind = "variable-length " if self.ragged else ""
        return f"{kind}{self.dtype} records of shape {self.item_shape}"

    def same_records(self, other: RecordSchema) -> bool:
        """Whether ``other`` describes the same records (the codec aside)."""
        return replace(other, codec=self.codec) == self

    def with_codec(self, codec: str) -> RecordSchema:
        return replace(self, codec=codec)

    def to_fields(self) -> dict[str, Any]:
        """The JSON fields, in the order chute has always written them (a sharded manifest's
        ``schema``; schema.json adds ``format`` and ``version`` before them)."""
        head: dict[str, Any] = {"ragged": True} if self.ragged else {}
        return {
            **head,
            "dtype": self.dtype.str,
            "item_shape" if self.ragged else "shape": list(self.item_shape),
            "codec": self.codec,
        }

    def to_json(self) -> bytes:
        """schema.json's bytes."""
        doc = {"format": SCHEMA_FORMAT, "version": SCHEMA_VERSION, **self.to_fields()}
        return json.dumps(doc, indent=2).encode() + b"\n"

    def write(self, path: Path) -> None:
        """Write schema.json into the store directory ``path`` (atomically)."""
        write_file_atomic(path / SCHEMA_FILE, self.to_json())

    @classmethod
    def read(cls, path: Path) -> RecordSchema:
        """Load and check ``path``'s schema.json; every failure names the file and the problem."""
        file = path / SCHEMA_FILE
        if path.is_file():
            raise StoreNotFoundError(
                f"{path} is a file, not a chute store (a store is a directory written by "
                "chute.write_dataset or write_ragged); convert an array with write_dataset"
            )
        try:
            raw = read_regular(file, path, MAX_SCHEMA_BYTES)
        except FileNotFoundError:
            if not path.exists():
                raise StoreNotFoundError(f"no dataset at {path}: the path does not exist") from None
            raise StoreNotFoundError(f"{path} has no schema.json: not a dataset") from None
        return cls.parse(raw, str(file))

    @classmethod
    def parse(cls, raw: bytes, where: str) -> RecordSchema:
        """schema.json's bytes (read from a folder or from object storage), checked; ``where``
        names the file in every error.

        >>> RecordSchema.parse(b'{"dtype": "<i8", "shape": [2]}', "x").item_shape
        (2,)
        """
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptStoreError(f"{where} is not valid JSON: {e}") from None
        except RecursionError:
            raise CorruptStoreError(f"{where} nests deeper than a schema does") from None
        return cls.from_fields(doc, where)

    @classmethod
    def from_fields(cls, doc: Any, where: str) -> RecordSchema:
        """Check a schema document (schema.json's, or a sharded manifest's ``schema``);
        ``where`` names it in every error."""
        if not isinstance(doc, dict) or "dtype" not in doc:
            raise CorruptStoreError(f"{where} does not describe a dataset (no 'dtype')")
        ragged = bool(doc.get("ragged"))
        dims = doc.get("item_shape" if ragged else "shape", ())
        if not isinstance(dims, list | tuple) or not all(
            isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims
        ):  # 4.5 or "4" would be cut or read as a number: the shape is damaged
            raise CorruptStoreError(f"{where}: the record shape must be integers, got {dims!r}")
        shape = tuple(int(d) for d in dims)
        try:
            dtype = np.dtype(doc["dtype"])
        except (TypeError, ValueError) as e:
            raise CorruptStoreError(f"{where}: bad dtype: {e}") from None
        try:
            check_plain_dtype(dtype)
        except TypeError as e:
            raise CorruptStoreError(f"{where}: {e}") from None
        if any(d < 0 for d in shape):
            raise CorruptStoreError(f"{where}: a negative dimension in the record shape")
        return cls(
            dtype=dtype, item_shape=shape, ragged=ragged, codec=str(doc.get("codec", "zstd"))
        )


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
    if dtype.names is not None:
        raise TypeError(
            f"dtype {dtype} is structured: schema.json keeps a plain dtype (its string), which "
            "would drop the field names; store each field as a dataset of its own, or pass "
            f"the rows viewed as bytes (np.dtype('V{dtype.itemsize}')) on purpose"
        )
