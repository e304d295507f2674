"""What a sharded dataset opens: dataset.json read with a bound, only regular files inside its
folder, and every malformed manifest a `ChuteError` naming the file. Whatever could hang or
exhaust memory runs in a child process with a timeout and a memory cap."""

from __future__ import annotations

import json
import os
import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute import (
    ChuteError,
    CorruptStoreError,
    Dataset,
    UnsafeFileError,
    append_dataset,
    write_dataset,
)
from chute.datasets import Manifest
from chute.datasets._sharded_manifest import checksum_of
from tests.store.isolate import OK, WRONG_DATA, run_isolated

ROWS = np.arange(20 * 3, dtype=np.int32).reshape(20, 3)
OTHER = -ROWS - 1


def _sharded(path: Path, rows: np.ndarray = ROWS) -> Path:
    write_dataset(path, rows, shard_records=10, codec="raw").close()
    return path


def _refused(path: Path, *, verify: bool = False) -> int:
    """In the child: OK when opening and reading ``path`` is an UnsafeFileError."""
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))  # /dev/zero: fail, not swap
    try:
        with Dataset(path, verify=verify) as ds:
            ds[:]
    except UnsafeFileError as e:
        return OK if str(path) in str(e) else WRONG_DATA
    return WRONG_DATA


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("dataset.json", "fifo"), ("dataset.json", "dev-zero"), ("gen.chute", "fifo"),
        ("part-00001.zr/schema.json", "fifo"),
    ],
)  # fmt: skip
def test_a_manifest_or_generation_file_that_is_a_fifo_or_dev_zero_is_refused(
    tmp_path: Path, name: str, kind: str
) -> None:
    path = _sharded(tmp_path / "d")
    (path / name).unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path / name)
    else:
        (path / name).symlink_to("/dev/zero")
    assert run_isolated(lambda: _refused(path), timeout=30) == OK


def test_a_manifest_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    path = _sharded(tmp_path / "d")
    with open(path / "dataset.json", "r+b") as f:
        f.truncate(65 << 20)  # sparse: past the 64 MiB a manifest may hold
    with pytest.raises(UnsafeFileError, match=r"dataset\.json holds more than"):
        Dataset(path)


@pytest.mark.parametrize("verify", [False, True])
def test_a_shard_linked_to_another_store_is_refused(tmp_path: Path, verify: bool) -> None:
    path, other = _sharded(tmp_path / "d"), _sharded(tmp_path / "other", OTHER)
    shutil.rmtree(path / "part-00001.zr")
    (path / "part-00001.zr").symlink_to(other / "part-00001.zr")
    with pytest.raises(UnsafeFileError, match=r"part-00001\.zr"):
        Dataset(path, verify=verify)
    with pytest.raises(UnsafeFileError, match=r"part-00001\.zr"):
        append_dataset(path, ROWS[:2])
    assert (other / "part-00001.zr" / "meta.zr").exists()  # nothing of it was touched


def test_a_chunk_file_linked_to_another_store_is_refused(tmp_path: Path) -> None:
    path, other = _sharded(tmp_path / "d"), _sharded(tmp_path / "other", OTHER)
    chunk = path / "part-00000.zr" / "0.zr"
    chunk.unlink()
    chunk.symlink_to(other / "part-00000.zr" / "0.zr")  # same sizes: only bytes differ
    with Dataset(path) as ds:
        assert np.array_equal(ds[15:], ROWS[15:])  # the other shard is fine
        with pytest.raises(UnsafeFileError, match=r"0\.zr leads outside"):
            ds[[0]]


def test_a_manifest_of_no_shards_is_an_empty_dataset_that_appends(tmp_path: Path) -> None:
    path = _sharded(tmp_path / "d")
    for part in path.glob("part-*"):
        shutil.rmtree(part)
    schema = {"dtype": np.dtype("<i4"), "shape": (3,), "codec": "zstd"}
    none = Manifest(schema=schema, shard_records=10, shards=())
    (path / "dataset.json").write_bytes(none.to_bytes())
    with Dataset(path) as ds:
        assert len(ds) == 0 and ds.shape == (0, 3)
    with append_dataset(path, ROWS[:13]) as ds:
        assert np.array_equal(ds[:], ROWS[:13])
        assert ds.store.manifest.shards == (("part-00000.zr", 10), ("part-00001.zr", 3))


@pytest.mark.parametrize("damage", ["nested", "folder"])
def test_a_malformed_manifest_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    path = _sharded(tmp_path / "d")
    manifest = path / "dataset.json"
    manifest.unlink()
    if damage == "nested":
        manifest.write_text("[" * 200_000 + "]" * 200_000)
    else:
        manifest.mkdir()
    for call in (lambda: Dataset(path), lambda: append_dataset(path, ROWS)):
        with pytest.raises(ChuteError, match=r"dataset\.json") as caught:
            call()
        expected = CorruptStoreError if damage == "nested" else UnsafeFileError
        assert isinstance(caught.value, expected)


def _edited(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Change dataset.json's fields and write it back with its checksum recomputed (as a
    hand edit the format allows), so only the edited values can be refused."""
    doc = json.loads((path / "dataset.json").read_text())
    doc.pop("checksum")
    edit(doc)
    doc["checksum"] = checksum_of(doc)
    (path / "dataset.json").write_text(json.dumps(doc))


ARABIC = "part-\u0661\u0662\u0663\u0664\u0665.zr"  # digits int() reads, \\d matched


@pytest.mark.parametrize(
    ("keys", "value", "field"),
    [
        (("records",), 19.5, "'records' is 19.5"),
        (("records",), "20", "'records' is '20'"),
        (("shards", 1, "records"), 9.9, r"'shards\[1\]\.records' is 9.9"),
        (("shards", 1, "records"), True, r"'shards\[1\]\.records' is True"),
        (("shard_records",), 10.5, "'shard_records' is 10.5"),
        (("shard_records",), False, "'shard_records' is False"),
        (("version",), True, "manifest version True"),
        (("version",), 1.0, "manifest version 1.0"),
        (("shards", 1, "name"), ARABIC, "outside the part-NNNNN.zr layout"),
        (("shards", 1, "name"), "part-00001.zr\n", "outside the part-NNNNN.zr layout"),
        (("shards",), {"name": "part-00000.zr"}, "not a list"),
        (("shards", 1, "name"), "part-00000.zr", r"\['part-00000.zr'\] more than once"),
    ],
)  # fmt: skip
def test_a_manifest_field_of_the_wrong_type_is_damage_naming_it(
    tmp_path: Path, keys: tuple[str | int, ...], value: Any, field: str
) -> None:
    """Integers are JSON integers (not a bool, a float or a string: int() truncated them,
    and 9.5 records opened as 9), shard names ASCII part-NNNNN.zr, each named once."""
    path = _sharded(tmp_path / "d")
    if value == ARABIC:
        os.rename(path / "part-00001.zr", path / ARABIC)

    def edit(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    _edited(path, edit)
    for call in (lambda: Dataset(path), lambda: append_dataset(path, ROWS)):
        with pytest.raises(CorruptStoreError, match=field) as caught:
            call()
        assert "dataset.json" in str(caught.value)


def test_a_shard_whose_schema_alone_is_gone_says_so(tmp_path: Path) -> None:
    path = _sharded(tmp_path / "d")
    (path / "part-00001.zr" / "schema.json").unlink()
    with Dataset(path) as ds, pytest.raises(CorruptStoreError, match=r"schema\.json of shard"):
        ds[15]
    shutil.rmtree(path / "part-00001.zr")
    with pytest.raises(CorruptStoreError, match=r"shards \['part-00001.zr'\] .* missing"):
        Dataset(path)
