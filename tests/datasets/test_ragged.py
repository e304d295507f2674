"""Ragged records: packed gather, pad, loaderx interop both ways, bad input, interrupted writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import loaderx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import DataLoader, RaggedDataset, pad, write_ragged
from tests.objects.remote import Serve

#: One store, or shards of 7 records.
KINDS: dict[str, dict[str, Any]] = {"single": {}, "sharded": {"shard_records": 7}}


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> dict[str, Any]:
    return KINDS[request.param]


def _seqs(n: int = 20, seed: int = 0, tail: tuple[int, ...] = ()) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(-1000, 1000, size=(int(rng.integers(1, 30)), *tail)).astype(np.int32)
        for _ in range(n)
    ]


def _check_packed(packed: Any, expected: list[np.ndarray]) -> None:
    values, splits = packed
    assert splits.dtype == np.int64 and splits.tolist()[0] == 0
    assert len(splits) == len(expected) + 1
    for i, e in enumerate(expected):
        np.testing.assert_array_equal(values[splits[i] : splits[i + 1]], e)


@pytest.mark.parametrize("codec", ["zstd", "raw", "zstd_dict"])
@pytest.mark.parametrize("tail", [(), (3,), (2, 2)])
def test_round_trip(
    tmp_path: Path, codec: str, tail: tuple[int, ...], kind: dict[str, Any], serve: Serve
) -> None:
    seqs = _seqs(40, tail=tail)
    ds = serve(write_ragged(tmp_path / "r.zr", seqs, codec=codec, chunk_bytes=500, **kind))
    assert len(ds) == 40 and ds.dtype == np.int32 and ds.item_shape == tail
    idx = [5, 0, 39, 5]
    _check_packed(ds[idx], [seqs[i] for i in idx])
    _check_packed(ds.__getitems__(np.array(idx, np.uint64)), [seqs[i] for i in idx])
    _check_packed(ds[2:6], seqs[2:6])
    np.testing.assert_array_equal(ds[-1], seqs[-1])
    np.testing.assert_array_equal(ds[np.int64(3)], seqs[3])
    assert ds.lengths(idx).tolist() == [len(seqs[i]) for i in idx]
    ds.close()


def test_empty_records_and_empty_batches(
    tmp_path: Path, kind: dict[str, Any], serve: Serve
) -> None:
    seqs = [np.arange(3.0), np.zeros(0), np.arange(2.0)]
    ds = serve(write_ragged(tmp_path / "r.zr", seqs, **({"shard_records": 2} if kind else {})))
    _check_packed(ds[[1, 0, 1, 2]], [seqs[1], seqs[0], seqs[1], seqs[2]])
    values, splits = ds[[]]
    assert values.shape == (0,) and splits.tolist() == [0]
    padded, lengths = ds.getitems_padded([1])
    assert padded.shape == (1, 0) and lengths.tolist() == [0]


def test_pad() -> None:
    values = np.arange(7, dtype=np.int16)
    splits = np.array([0, 3, 3, 7])
    padded, lengths = pad(values, splits, pad_value=-1)
    assert padded.dtype == np.int16 and lengths.tolist() == [3, 0, 4]
    assert padded.tolist() == [[0, 1, 2, -1], [-1, -1, -1, -1], [3, 4, 5, 6]]
    wide, _ = pad(values, splits, max_len=6)
    assert wide.shape == (3, 6) and wide[2].tolist() == [3, 4, 5, 6, 0, 0]
    vec, _ = pad(np.ones((3, 2), np.float32), [0, 1, 3])
    assert vec.shape == (2, 2, 2) and vec[0, 1].tolist() == [0, 0]
    with pytest.raises(ValueError, match="4 rows, over max_len=3"):
        pad(values, splits, max_len=3)
    with pytest.raises(ValueError, match="rise from 0"):
        pad(values, [0, 3, 2, 7])
    with pytest.raises(ValueError, match="rise from 0"):
        pad(values, [0, 3, 8])
    with pytest.raises(ValueError, match="1-D integer"):
        pad(values, [])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(-100, 100), max_size=12), max_size=10))
def test_pad_keeps_every_row(rows: list[list[int]]) -> None:
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    splits = np.cumsum([0] + [len(r) for r in rows])
    padded, lengths = pad(values, splits, pad_value=999)
    assert lengths.tolist() == [len(r) for r in rows]
    for i, r in enumerate(rows):
        assert padded[i, : len(r)].tolist() == r
        assert (padded[i, len(r) :] == 999).all()


def test_getitems_padded_matches_gather_then_pad(
    tmp_path: Path, kind: dict[str, Any], serve: Serve
) -> None:
    seqs = _seqs(10, tail=(3,))
    ds = serve(write_ragged(tmp_path / "r.zr", seqs, **kind))
    fused = ds.getitems_padded([4, 1, 7], max_len=40, pad_value=-5)
    separate = pad(*ds[[4, 1, 7]], max_len=40, pad_value=-5)
    np.testing.assert_array_equal(fused[0], separate[0])
    np.testing.assert_array_equal(fused[1], separate[1])
    assert fused[0].shape == (3, 40, 3)


@pytest.mark.parametrize("codec", ["zstd", "raw", "zstd_dict"])
def test_loaderx_reads_chute(tmp_path: Path, codec: str) -> None:
    seqs = _seqs(30, tail=(2,))
    seqs[3] = np.zeros((0, 2), np.int32)  # loaderx cannot write an empty record, but reads one
    write_ragged(tmp_path / "r.zr", seqs, codec=codec).close()
    theirs = loaderx.RaggedDataset(str(tmp_path / "r.zr"))
    assert len(theirs) == 30
    _check_packed(theirs[[3, 29, 0]], [seqs[3], seqs[29], seqs[0]])
    padded, lengths = theirs.getitems_padded([1, 2])
    ours = pad(*RaggedDataset(tmp_path / "r.zr")[[1, 2]])
    np.testing.assert_array_equal(padded, ours[0])
    np.testing.assert_array_equal(lengths, ours[1])


@pytest.mark.parametrize("codec", ["zstd", "raw", "zstd_dict"])
def test_chute_reads_loaderx(tmp_path: Path, codec: str) -> None:
    seqs = [s.astype(np.float32) for s in _seqs(30)]
    loaderx.write_ragged(str(tmp_path / "r.zr"), seqs, codec=codec)
    ours = RaggedDataset(tmp_path / "r.zr")
    assert len(ours) == 30 and ours.dtype == np.float32 and ours.item_shape == ()
    assert ours.codec == codec
    _check_packed(ours[[7, 7, 0]], [seqs[7], seqs[7], seqs[0]])
    their_padded, their_lengths = loaderx.RaggedDataset(str(tmp_path / "r.zr")).getitems_padded(
        [4, 9]
    )
    padded, lengths = ours.getitems_padded([4, 9])
    np.testing.assert_array_equal(padded, their_padded)
    np.testing.assert_array_equal(lengths, their_lengths)


def test_schema_matches_loaderx(tmp_path: Path) -> None:
    seqs = [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)]
    write_ragged(tmp_path / "ours.zr", seqs).close()
    loaderx.write_ragged(str(tmp_path / "theirs.zr"), seqs)
    ours = json.loads((tmp_path / "ours.zr" / "schema.json").read_text())
    theirs = json.loads((tmp_path / "theirs.zr" / "schema.json").read_text())
    assert ours == theirs


def test_loader_over_ragged_and_fixed_streams(
    tmp_path: Path, kind: dict[str, Any], serve: Serve
) -> None:
    seqs = _seqs(50)
    tokens = serve(write_ragged(tmp_path / "tok.zr", seqs, **kind))
    labels = serve(chute.write_dataset(tmp_path / "lab.zr", np.arange(50, dtype=np.int32), **kind))

    def collate(batch: dict[str, Any]) -> dict[str, Any]:
        padded, lengths = pad(*batch["tokens"], max_len=32)
        return {"input_ids": padded, "lengths": lengths, "label": batch["label"]}

    def run(start: int, n: int, threads: int) -> list[dict[str, Any]]:
        streams = {"tokens": tokens, "label": labels}
        with DataLoader(streams, 8, "cyclic", 4, start, threads, transform=collate) as dl:
            return [next(dl) for _ in range(n)]

    whole = run(0, 10, 1)
    resumed = run(0, 4, 2) + run(4, 6, 3)
    for a, b in zip(whole, resumed, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    for batch in whole:
        assert batch["input_ids"].shape == (8, 32)
        for row, n, label in zip(batch["input_ids"], batch["lengths"], batch["label"], strict=True):
            np.testing.assert_array_equal(row[:n], seqs[label])


def test_bad_records_are_clear_errors(tmp_path: Path, kind: dict[str, Any]) -> None:
    kw = {"shard_records": 2} if kind else {}  # records 1 and 2 in different shards
    with pytest.raises(ValueError, match=r"record 1 has shape \(2, 4\).*\(rows, 3\)"):
        write_ragged(tmp_path / "a.zr", [np.zeros((2, 3)), np.zeros((2, 4))], **kw)
    with pytest.raises(ValueError, match=r"record 0 has shape \(\)"):
        write_ragged(tmp_path / "b.zr", [np.float32(1.0)], **kw)
    for record, what in (("abc", "a str"), (None, "None"), (3, "a int")):
        with pytest.raises(TypeError, match=f"record 1 is {what}, not an array or bytes"):
            write_ragged(tmp_path / "s.zr", [b"ok", record], **kw)
    with pytest.raises(TypeError, match="encode it to bytes first"):
        write_ragged(tmp_path / "s.zr", ["abc"], **kw)
    with pytest.raises(TypeError, match="record 1 has dtype float64, the set is int32"):
        write_ragged(tmp_path / "c.zr", [np.zeros(2, np.int32), np.zeros(2)], **kw)
    big = [np.zeros(1, np.uint8)] * 2 + [np.zeros(2_000_000, "u1")]
    with pytest.raises(ValueError, match="record 2 is 2000000 bytes"):
        write_ragged(tmp_path / "d.zr", big, **kw)
    with pytest.raises(TypeError, match="holds Python objects"):
        write_ragged(tmp_path / "o.zr", [np.array(["a", 1], dtype=object)], **kw)
    with pytest.raises(ValueError, match="no records to write"):
        write_ragged(tmp_path / "e.zr", [], **kw)
    empty = write_ragged(tmp_path / "f.zr", [], dtype=np.int64, item_shape=(2,), **kw)
    assert len(empty) == 0 and empty.item_shape == (2,)
    with pytest.raises(ValueError, match="empty"):
        DataLoader({"x": empty})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_ragged(tmp_path / "f.zr", [np.zeros(1)], **kw)
    assert len(write_ragged(tmp_path / "f.zr", [np.zeros(1)], overwrite=True, **kw)) == 1
    if not kind:
        with pytest.raises(chute.StoreChangedError, match="reopen"):
            len(empty)  # opened before the overwrite: its records are gone


def test_wrong_kind_of_store_is_refused(tmp_path: Path, kind: dict[str, Any]) -> None:
    chute.write_dataset(tmp_path / "fixed.zr", np.zeros((4, 2)), **kind).close()
    write_ragged(tmp_path / "ragged.zr", [np.zeros(2)], **kind).close()
    with pytest.raises(chute.StoreError, match="fixed-shape records: open it with Dataset"):
        RaggedDataset(tmp_path / "fixed.zr")
    with pytest.raises(chute.StoreError, match="RaggedDataset"):
        chute.Dataset(tmp_path / "ragged.zr")
    with pytest.raises(chute.StoreNotFoundError):
        RaggedDataset(tmp_path / "missing.zr")
    with pytest.raises(IndexError, match="index 1 is out of range"):
        RaggedDataset(tmp_path / "ragged.zr")[[0, 1]]


def test_schema_that_disagrees_with_records_is_corruption(tmp_path: Path) -> None:
    write_ragged(tmp_path / "r.zr", [np.zeros(3, np.int8), np.zeros(4, np.int8)]).close()
    schema = tmp_path / "r.zr" / "schema.json"
    doc = json.loads(schema.read_text())
    doc["dtype"] = "<i4"
    schema.write_text(json.dumps(doc))
    ds = RaggedDataset(tmp_path / "r.zr")
    with pytest.raises(chute.CorruptStoreError, match="not a whole number of 4-byte rows"):
        ds[[0, 1]]


def test_interrupted_write_leaves_a_store_that_opens(tmp_path: Path) -> None:
    seqs = _seqs(40)

    def source() -> Any:
        for i, s in enumerate(seqs):
            if i == 25:
                raise KeyboardInterrupt("stopped mid-write")
            yield s

    with pytest.raises(KeyboardInterrupt):
        write_ragged(tmp_path / "r.zr", source(), chunk_bytes=300)
    ds = RaggedDataset(tmp_path / "r.zr")
    assert 0 < len(ds) < 25
    _check_packed(ds[list(range(len(ds)))], seqs[: len(ds)])


def test_loader_reads_loaderx_datasets_as_streams(tmp_path: Path) -> None:
    seqs = _seqs(12)
    loaderx.write_ragged(str(tmp_path / "t.zr"), seqs)
    loaderx.write_dataset(str(tmp_path / "y.zr"), np.arange(12, dtype=np.int32))
    streams = {
        "tokens": loaderx.RaggedDataset(str(tmp_path / "t.zr")),
        "label": loaderx.Dataset(str(tmp_path / "y.zr")),
    }
    with DataLoader(streams, batch_size=4, sampler="sequential") as dl:
        batch = next(dl)
    assert batch["label"].tolist() == [0, 1, 2, 3]
    _check_packed(batch["tokens"], seqs[:4])


def test_bytes_records_are_uint8_rows_byte_for_byte(
    tmp_path: Path, kind: dict[str, Any], serve: Serve
) -> None:
    blobs = [b"\x00a\x00", bytearray(b""), memoryview(b"\x00\x00")]
    with serve(write_ragged(tmp_path / "b", blobs, **kind)) as ds:
        assert ds.dtype == np.uint8 and ds.item_shape == ()
        assert [ds[i].tobytes() for i in range(len(ds))] == [bytes(b) for b in blobs]
        assert ds.lengths([0, 1, 2]).tolist() == [3, 0, 2]
