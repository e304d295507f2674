"""dataset.json: the manifest of a sharded dataset, and every on-disk fact of the layout.

A sharded dataset is a directory::

    dataset.json     the manifest (below); written last, atomically: its presence commits
    part-00000.zr    a complete store (meta.zr, chunks, crc32c.chute, schema.json)
    part-00001.zr    ...
    dataset.lock     taken by the one writer (write, append, compact); readers never lock
    gen.chute        the dataset's generation (a store's gen.chute format), raised by each
                     overwrite before a shard is removed; a reader opened before raises
                     StoreChangedError. Only chute reads it; a dataset without it is at 0.

The manifest is UTF-8 JSON holding one object::

    format         "chute-sharded"
    version        1
    schema         the shards' schema.json fields: dtype, shape or ragged + item_shape, codec
    shard_records  the most records one shard holds (appends fill the last shard up to it)
    records        the total, equal to the sum of the shards' records
    shards         [{"name": "part-00000.zr", "records": n}, ...] in global index order
    checksum       "sha256:" + hex SHA-256 of the canonical form of every other field

The canonical form is ``json.dumps(fields, sort_keys=True, separators=(",", ":"),
ensure_ascii=True)`` encoded as ASCII, so any JSON writer that keeps the values can re-emit
the file and the checksum still holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

from chute._util.fs import write_file_atomic
from chute._util.safe_open import read_regular
from chute.datasets._schema import RecordSchema
from chute.errors import (
    CorruptStoreError,
    IncompleteDatasetError,
    StoreNotFoundError,
    UnsafeFileError,
)
from chute.store._internal import MAX_RECORDS, META_FILE, SHARDED_MANIFEST

MANIFEST_FILE: Final = SHARDED_MANIFEST
#: dataset.json's size cap: about 900 000 shards, where chute writes ~75 bytes per shard.
MAX_MANIFEST_BYTES: Final = 64 << 20
LOCK_FILE: Final = "dataset.lock"
FORMAT: Final = "chute-sharded"
VERSION: Final = 1
_SHARD_NAME = re.compile(r"part-[0-9]{5,}\.zr")  # ASCII digits: int() reads others too


def shard_name(i: int) -> str:
    return f"part-{i:05d}.zr"


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a shard's (``part-NNNNN.zr``, five digits or more)."""
    return _SHARD_NAME.fullmatch(name) is not None


def next_shard_number(names: Iterable[str]) -> int:
    """The first shard number above every shard name in ``names`` (0 for none): new shards
    named from it collide with no shard there, named by a manifest or left by a writer.

    >>> next_shard_number(["part-00000.zr", "part-00007.zr", "dataset.json"])
    8
    """
    numbers = [int(n[5:-3]) for n in names if is_shard_name(n)]
    return max(numbers) + 1 if numbers else 0


def shard_dirs(path: Path) -> list[Path]:
    """The shard directories present under ``path`` (committed or not), in name order; a
    symlink of a shard's name is listed too (never followed: see `remove_shard`)."""
    if not path.is_dir():
        return []
    return sorted(
        p
        for p in path.iterdir()
        if _SHARD_NAME.fullmatch(p.name) and (p.is_symlink() or p.is_dir())
    )


def remove_shard(part: Path) -> None:
    """Remove a shard directory, or only the link where a symlink stands in its place."""
    if part.is_symlink():
        part.unlink()
    else:
        shutil.rmtree(part)


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """True for a sharded dataset, finished (a manifest) or not (shards and no store).

    >>> import tempfile, numpy as np, chute
    >>> d = tempfile.mkdtemp()
    >>> chute.write_dataset(d + "/one.zr", np.arange(10)).close()
    >>> chute.write_dataset(d + "/many", np.arange(10), shard_records=4).close()
    >>> is_sharded(d + "/one.zr"), is_sharded(d + "/many")
    (False, True)
    """
    path = Path(path)
    if (path / MANIFEST_FILE).exists():
        return True
    return not (path / META_FILE).exists() and bool(shard_dirs(path))


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The parsed dataset.json: the schema, the shard cap, and each shard's name and length.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/many"
    >>> chute.write_dataset(path, np.arange(10), shard_records=4).close()
    >>> m = read_manifest(path)
    >>> m.records, m.shard_records, m.shards[-1]
    (10, 4, ('part-00002.zr', 2))
    >>> m.starts().tolist()  # global index of each shard's first record, then the total
    [0, 4, 8, 10]
    """

    schema: RecordSchema
    shard_records: int
    shards: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if isinstance(self.schema, dict):  # schema fields as a manifest holds them
            object.__setattr__(self, "schema", RecordSchema.from_fields(self.schema, "schema"))

    @property
    def records(self) -> int:
        return sum(n for _, n in self.shards)

    def starts(self) -> npt.NDArray[np.int64]:
        """The global index of each shard's first record, then the total (n_shards + 1)."""
        out = np.zeros(len(self.shards) + 1, np.int64)
        np.cumsum([n for _, n in self.shards], out=out[1:])
        return out

    def to_bytes(self) -> bytes:
        fields: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "schema": self.schema.to_fields(),
            "shard_records": self.shard_records,
            "records": self.records,
            "shards": [{"name": name, "records": n} for name, n in self.shards],
        }
        doc = {**fields, "checksum": checksum_of(fields)}
        return json.dumps(doc, indent=2).encode() + b"\n"


def checksum_of(fields: dict[str, Any]) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of ``fields``."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Commit ``manifest``: atomic and durable, so a crash leaves the old one or the new."""
    write_file_atomic(path / MANIFEST_FILE, manifest.to_bytes(), durable=True)


def parse_manifest(raw: bytes, file: str) -> Manifest:
    """A manifest's bytes checked and parsed (``file`` names it in errors): JSON of the
    format and version, its checksum, its fields, shard names and counts.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/many"
    >>> chute.write_dataset(path, np.arange(5), shard_records=4).close()
    >>> raw = open(path + "/dataset.json", "rb").read()
    >>> parse_manifest(raw, "dataset.json").shards
    (('part-00000.zr', 4), ('part-00001.zr', 1))
    """
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptStoreError(f"{file} is not valid JSON: {e}") from None
    except RecursionError:
        raise CorruptStoreError(f"{file} nests deeper than a manifest does") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptStoreError(f"{file} is not a {FORMAT} manifest")
    version = doc.get("version")
    if not _is_int(version) or version != VERSION:
        raise CorruptStoreError(
            f"{file} has manifest version {version!r}; this chute reads {VERSION}"
        )
    fields = {k: v for k, v in doc.items() if k != "checksum"}
    if doc.get("checksum") != checksum_of(fields):
        raise CorruptStoreError(f"{file} does not match its own checksum: the manifest is damaged")
    cap = _int_field(doc, "shard_records", file)
    total = _int_field(doc, "records", file)
    listed = doc.get("shards")
    if not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
        raise CorruptStoreError(f"{file}: 'shards' is not a list of objects")
    shards = tuple(
        (_name_field(s, f"shards[{k}].name", file), _int_field(s, "records", file, f"shards[{k}]."))
        for k, s in enumerate(listed)
    )
    schema = RecordSchema.from_fields(doc.get("schema"), f"{file} 'schema'")
    names = [name for name, _ in shards]
    twice = sorted(name for name, n in Counter(names).items() if n > 1)
    if twice:
        raise CorruptStoreError(f"{file} names shards {twice} more than once")
    if not 1 <= cap <= MAX_RECORDS or any(not 0 <= n <= cap for _, n in shards):
        raise CorruptStoreError(f"{file}: shard lengths must lie in [0, {cap}] with 1 <= cap")
    manifest = Manifest(schema=schema, shard_records=cap, shards=shards)
    if manifest.records != total:
        raise CorruptStoreError(
            f"{file} says {total} records but its shards add up to {manifest.records}"
        )
    return manifest


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON's integers: not a bool, a float or a string of digits


def _int_field(doc: dict[str, Any], key: str, file: str, where: str = "") -> int:
    """``doc[key]``, an integer, else `CorruptStoreError` naming ``file`` and the field."""
    value = doc.get(key)
    if not _is_int(value):
        raise CorruptStoreError(f"{file}: '{where}{key}' is {value!r}, not an integer")
    return cast(int, value)


def _name_field(doc: dict[str, Any], field: str, file: str) -> str:
    """A shard's name, ``part-NNNNN.zr`` (ASCII digits, five or more)."""
    name = doc.get("name")
    if not isinstance(name, str) or not _SHARD_NAME.fullmatch(name):
        raise CorruptStoreError(f"{file}: '{field}' is {name!r}, outside the part-NNNNN.zr layout")
    return name


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Load and check dataset.json; a missing one beside shards is an unfinished write.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/many"
    >>> chute.write_dataset(path, np.zeros((10, 3), np.float32), shard_records=5).close()
    >>> m = read_manifest(path)
    >>> [name for name, _ in m.shards], m.schema.dtype, m.schema.item_shape
    (['part-00000.zr', 'part-00001.zr'], dtype('float32'), (3,))
    """
    path = Path(path)
    file = path / MANIFEST_FILE
    try:
        raw = read_regular(file, path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        if shard_dirs(path):
            raise IncompleteDatasetError(
                f"{path} holds shards but no {MANIFEST_FILE}: its write did not finish "
                "(write it again with overwrite=True)"
            ) from None
        raise StoreNotFoundError(f"no sharded dataset at {path}: no {MANIFEST_FILE}") from None
    manifest = parse_manifest(raw, str(file))
    names = [name for name, _ in manifest.shards]
    linked = [name for name in names if (path / name).is_symlink()]
    if linked:
        raise UnsafeFileError(
            f"{path}: shards {linked} are symlinks; a dataset reads only its own folder"
        )
    missing = [name for name in names if not (path / name / META_FILE).exists()]
    if missing:
        raise CorruptStoreError(f"{path}: shards {missing} of the manifest are missing")
    return manifest
