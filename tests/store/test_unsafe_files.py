"""A store's own files must be regular files inside its folder: a FIFO as meta.zr would hang
the open, a link out would be read (or, by a writer, changed) in place of the store's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chute import RecordStore, UnsafeFileError
from tests.store.isolate import OK, UNEXPECTED, WRONG_DATA, run_isolated


@pytest.mark.parametrize("mode", ["r", "a"])
def test_a_fifo_meta_is_refused_without_hanging(tmp_path: Path, mode: str) -> None:
    store = tmp_path / "s"
    store.mkdir()
    os.mkfifo(store / "meta.zr")

    def child() -> int:
        try:
            RecordStore(store, mode=mode)  # type: ignore[arg-type]
        except UnsafeFileError as e:
            return OK if "FIFO" in str(e) else UNEXPECTED
        return WRONG_DATA

    assert run_isolated(child, timeout=30) == OK


@pytest.mark.parametrize("mode", ["r", "a", "w"])
def test_a_meta_linked_out_of_the_store_is_neither_read_nor_changed(
    tmp_path: Path, mode: str
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with RecordStore(outside, mode="w") as other:
        other.append([b"not this store's"])
    victim = (outside / "meta.zr").read_bytes()
    store = tmp_path / "s"
    store.mkdir()
    (store / "meta.zr").symlink_to(outside / "meta.zr")
    with pytest.raises(UnsafeFileError, match=r"outside|is a link"):
        RecordStore(store, mode=mode)  # type: ignore[arg-type]
    assert (outside / "meta.zr").read_bytes() == victim
