"""Token datasets: documents in, one stream out, document edges kept, damage reported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import BytesDataset, TokenDataset, write_ragged, write_tokens
from chute.errors import CorruptStoreError, RecordIndexError, StoreKindError

from .remote_helpers import new_bucket, options


def _docs(seed: int, n: int, longest: int, vocab: int = 60000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, longest + 1))).astype(np.uint16)
            for _ in range(n)]  # fmt: skip


def _check_all(ds: TokenDataset, docs: list[np.ndarray]) -> None:
    stream = np.concatenate(docs)
    starts = np.cumsum([0] + [d.size for d in docs[:-1]])
    assert len(ds) == len(docs) and ds.num_tokens == stream.size
    assert np.array_equal(ds.tokens(0, ds.num_tokens), stream)
    assert np.array_equal(ds.document_starts(0, ds.num_tokens), starts)
    for i, doc in enumerate(docs):
        assert np.array_equal(ds[i], doc)
        assert ds.document_span(i) == (int(starts[i]), int(starts[i]) + doc.size)
    assert np.array_equal(ds[-1], docs[-1])


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=40),
    record_tokens=st.integers(1, 50),
    wide=st.booleans(),
)
def test_any_documents_round_trip(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], record_tokens: int, wide: bool
) -> None:
    dtype = np.uint32 if wide else np.uint16
    top = (1 << 32) - 1 if wide else (1 << 16) - 1
    docs = [(np.arange(n, dtype=np.uint64) * 7919 + i) % (top + 1) for i, n in enumerate(lengths)]
    docs = [d.astype(dtype) for d in docs]
    path = tmp_path_factory.mktemp("t") / "c"
    with write_tokens(path, docs, dtype=dtype, record_tokens=record_tokens) as ds:
        assert ds.dtype == np.dtype(dtype) and ds.record_tokens == record_tokens
        _check_all(ds, docs)
        stream = np.concatenate(docs)
        rng = np.random.default_rng(len(lengths))
        a = rng.integers(0, stream.size, 20)
        n = rng.integers(0, stream.size - a + 1)
        want = np.concatenate([stream[x : x + k] for x, k in zip(a, n, strict=True)])
        assert np.array_equal(ds.read_spans(a, n), want)
        lo, hi = sorted(rng.integers(0, stream.size + 1, 2).tolist())
        every = np.cumsum([0, *lengths[:-1]])
        assert np.array_equal(ds.document_starts(lo, hi), every[(every >= lo) & (every < hi)])


def test_a_document_of_1_5_mb_round_trips(tmp_path: Path) -> None:
    """The document that met the 1 MiB record cap as a record of its own (pydoc's topics as
    uint16 is 1.5 MB) is one document of a token dataset."""
    import pydoc_data.topics as topics

    text = Path(topics.__file__).read_bytes()
    big = np.frombuffer(text, np.uint8).astype(np.uint16)
    if big.nbytes < 1_500_000:  # a Python whose topics file is smaller: make one that is not
        big = np.resize(big, 760_000)
    docs = [np.array([1, 2, 3], np.uint16), big, np.array([4], np.uint16)]
    with write_tokens(tmp_path / "c", docs) as ds:
        assert big.nbytes > 1 << 20
        _check_all(ds, docs)
        assert bytes(ds[1].astype(np.uint8)) == bytes(big.astype(np.uint8))


def test_bytes_documents_are_byte_level_tokens(tmp_path: Path) -> None:
    with write_tokens(tmp_path / "c", [b"def f():\n", b"    pass\n"]) as ds:
        assert ds.dtype == np.uint16
        assert bytes(ds[0].astype(np.uint8)) == b"def f():\n"


def test_sharded_and_pickled(tmp_path: Path) -> None:
    import pickle

    docs = _docs(1, 300, 400)
    with write_tokens(tmp_path / "c", docs, record_tokens=64, shard_records=50) as ds:
        assert ds.shard_lengths is not None and len(ds.shard_lengths) > 1
        _check_all(ds, docs)
        copy = pickle.loads(pickle.dumps(ds))
        assert np.array_equal(copy[7], docs[7])
        copy.close()


def test_in_object_storage(s3_server: str) -> None:
    url = f"s3://{new_bucket(s3_server)}/corpus"
    docs = _docs(2, 120, 300)
    with write_tokens(url, docs, record_tokens=100, shard_records=40,
                      **options(s3_server)) as ds:  # fmt: skip
        _check_all(ds, docs)
    with TokenDataset(url, **options(s3_server)) as again:
        assert np.array_equal(again[50], docs[50])
        windows = chute.TokenWindows(again, 64)
        rows = windows.__getitems__(np.arange(len(windows), dtype=np.uint64))["tokens"]
        stream = np.concatenate(docs)
        assert all(np.array_equal(r, stream[w * 64 : w * 64 + 65]) for w, r in enumerate(rows))


@pytest.mark.parametrize(
    ("docs", "kwargs", "error", "words"),
    [
        ([[1, 2], []], {"dtype": np.uint16}, ValueError, "document 1 is empty"),
        ([[1, 2], [70000]], {"dtype": np.uint16}, ValueError, "token 70000"),
        ([[1, -1]], {"dtype": np.uint32}, ValueError, "token -1"),
        ([np.array([1.5])], {}, TypeError, "integer tokens"),
        ([np.zeros((2, 2), np.uint16)], {}, TypeError, "1-D"),
        ([np.arange(3)], {}, TypeError, "pass dtype=np.uint16"),
        ([], {"dtype": np.uint16}, ValueError, "no documents"),
        ([[1]], {"dtype": np.int64}, TypeError, "uint16 or uint32"),
        ([[1]], {"dtype": np.uint16, "record_tokens": 1 << 20}, ValueError, "record_tokens"),
        ([[1]], {"dtype": np.uint16, "record_tokens": 0}, ValueError, "record_tokens"),
    ],
)
def test_bad_documents_are_refused_and_leave_nothing(
    tmp_path: Path, docs: list, kwargs: dict, error: type, words: str
) -> None:
    path = tmp_path / "c"
    with pytest.raises(error, match=words):
        write_tokens(path, docs, **kwargs)
    assert not path.exists()  # a rerun needs no overwrite=True


def test_a_failure_part_way_through_a_generator_leaves_nothing(tmp_path: Path) -> None:
    def docs():
        for i in range(5000):
            yield np.arange(200, dtype=np.uint32) + (70000 if i == 4000 else 0)

    with pytest.raises(ValueError, match="document 4000"):
        write_tokens(tmp_path / "c", docs(), dtype=np.uint16, record_tokens=256)
    assert not (tmp_path / "c").exists()
    write_tokens(tmp_path / "c", [[1, 2]], dtype=np.uint16).close()


def test_overwrite(tmp_path: Path) -> None:
    write_tokens(tmp_path / "c", [[1, 2, 3]], dtype=np.uint16).close()
    with pytest.raises(FileExistsError):
        write_tokens(tmp_path / "c", [[4]], dtype=np.uint16)
    with write_tokens(tmp_path / "c", [[4]], dtype=np.uint16, overwrite=True) as ds:
        assert ds[0].tolist() == [4]


def test_other_datasets_are_not_token_datasets(tmp_path: Path) -> None:
    chute.write_dataset(tmp_path / "fixed", np.zeros((3, 2), np.uint16)).close()
    write_ragged(tmp_path / "bytes", [b"abcdefghijklmnopqrstuvwxyz0123456789"]).close()
    with pytest.raises(StoreKindError, match="fixed-shape"):
        TokenDataset(tmp_path / "fixed")
    with pytest.raises(StoreKindError, match="not a token dataset"):
        TokenDataset(tmp_path / "bytes")


def test_indices_and_spans_out_of_range(tmp_path: Path) -> None:
    with write_tokens(tmp_path / "c", [[1, 2], [3]], dtype=np.uint16) as ds:
        with pytest.raises(RecordIndexError):
            ds[2]
        with pytest.raises(RecordIndexError):
            ds.read_spans([2], [2])
        with pytest.raises(ValueError):
            ds.tokens(2, 1)
        with pytest.raises(TypeError, match="document number"):
            ds[0:1]  # type: ignore[index]
        for bad in (1.5, True, "0"):
            with pytest.raises(TypeError, match="document number"):
                ds.document_span(bad)  # type: ignore[arg-type]


def _rewritten(tmp_path: Path, change) -> Path:
    """The records of a token dataset, changed by ``change`` (a list of bytes in, out),
    written as a new bytes dataset: damage a reader must notice."""
    docs = _docs(3, 40, 100)
    write_tokens(tmp_path / "good", docs, record_tokens=32).close()
    with BytesDataset(tmp_path / "good") as raw:
        records = raw[0 : len(raw)]
    write_ragged(tmp_path / "bad", change(list(records))).close()
    return tmp_path / "bad"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: [r[0], r[2], r[1], *r[3:]], "another offset"),
        (lambda r: [r[0], r[1][:40], *r[2:]], "length"),
        (lambda r: [r[0], b"XXXX" + r[1][4:], *r[2:]], "no token header"),
        (
            lambda r: [r[0], r[1][:8] + (99).to_bytes(4, "little") + r[1][12:], *r[2:]],
            "record size",
        ),
    ],
)
def test_damaged_records_are_reported(tmp_path: Path, change, words: str) -> None:
    with (
        TokenDataset(_rewritten(tmp_path, change)) as ds,
        pytest.raises(CorruptStoreError, match=words),
    ):
        ds.tokens(0, ds.num_tokens)


def test_damaged_document_starts_are_reported(tmp_path: Path) -> None:
    def swap_starts(records: list[bytes]) -> list[bytes]:
        k = next(k for k, r in enumerate(records) if int.from_bytes(r[16:20], "little"))
        r = bytearray(records[k])
        if int.from_bytes(r[16:20], "little") >= 2:  # two starts: put them out of order
            r[-8:] = r[-4:] + r[-8:-4]
        else:  # one: past the record's tokens
            r[-4:] = (1000).to_bytes(4, "little")
        return [*records[:k], bytes(r), *records[k + 1 :]]

    with (
        TokenDataset(_rewritten(tmp_path, swap_starts)) as ds,
        pytest.raises(CorruptStoreError, match="document starts"),
    ):
        ds.document_starts(0, ds.num_tokens)


def test_damage_in_a_record_without_starts_is_reported_by_every_reader(tmp_path: Path) -> None:
    """Packing reads its document starts only from the records the table says hold some;
    a damaged record holding none is then reported where its tokens are read, and by
    `document_starts`, which reads every record of its span."""

    def damage_a_record_without_starts(records: list[bytes]) -> list[bytes]:
        k = next(k for k, r in enumerate(records) if k and not int.from_bytes(r[16:20], "little"))
        return [*records[:k], b"XXXX" + records[k][4:], *records[k + 1 :]]

    with TokenDataset(_rewritten(tmp_path, damage_a_record_without_starts)) as ds:
        for read in (
            lambda: ds.document_starts(0, ds.num_tokens),
            lambda: ds.tokens(0, ds.num_tokens),
            lambda: chute.PackedTokens(ds, 16, group=4).__getitems__(np.arange(8)),
        ):
            with pytest.raises(CorruptStoreError, match="no token header"):
                read()


def test_a_table_entry_cut_short_is_reported_not_a_document_lost(tmp_path: Path) -> None:
    """A record table whose entry says a record holds one document start fewer than it does
    (its length cut by 4 bytes): reading the record's starts finds its header disagreeing."""
    import struct

    docs = [np.arange(150), np.arange(1000, 1100), np.arange(2000, 2050)]
    write_tokens(tmp_path / "t", docs, dtype=np.uint16, record_tokens=100).close()
    meta = bytearray((tmp_path / "t" / "meta.zr").read_bytes())
    at = 16 + 16 * 1  # record 1 (tokens 100..199) holds document 1's start
    phys, logic = struct.unpack_from("<II", meta, at + 4)
    struct.pack_into("<II", meta, at + 4, phys - 4, logic - 4)
    (tmp_path / "t" / "meta.zr").write_bytes(bytes(meta))
    with TokenDataset(tmp_path / "t") as ds:
        for read in (
            lambda: ds.document_starts(0, ds.num_tokens),
            lambda: chute.PackedTokens(ds, 64, group=2).__getitems__(np.arange(4)),
            lambda: chute.TokenWindows(ds, 64, documents=True).__getitems__(np.arange(4)),
        ):
            with pytest.raises(CorruptStoreError, match="record 1"):
                read()
    with (  # verified, every read checks every record: packing row 0 alone, too
        TokenDataset(tmp_path / "t", verify=True) as ds,
        pytest.raises(CorruptStoreError, match="record 1"),
    ):
        chute.PackedTokens(ds, 64, group=2).__getitems__(np.arange(1))


@pytest.mark.parametrize("shards", [None, 2])
def test_empty_spans_inside_a_record_read_nothing(tmp_path: Path, shards: int | None) -> None:
    with write_tokens(tmp_path / "t", [np.arange(40)], dtype=np.uint16, record_tokens=7,
                      shard_records=shards) as ds:  # fmt: skip
        assert ds.tokens(3, 3).size == 0 and ds.document_starts(3, 3).size == 0
        assert ds.read_spans([3, 10], [0, 2]).tolist() == [10, 11]
        tokens, starts, counts = ds.read_spans_documents([3, 0], [0, 7])
        assert tokens.tolist() == list(range(7)) and starts.tolist() == [0]
        assert counts.tolist() == [0, 1]


def test_an_unfinished_write_is_reported(tmp_path: Path) -> None:
    """A single store commits records as they come: a writer killed part way leaves a
    prefix, whose last record lacks the end-of-stream flag; so do records added after it."""
    from chute.errors import IncompleteDatasetError

    for name, change in (("cut", lambda r: r[:-1]), ("grown", lambda r: [*r, r[1]])):
        (tmp_path / name).mkdir()
        with pytest.raises(IncompleteDatasetError, match="did not finish"):
            TokenDataset(_rewritten(tmp_path / name, change))


def test_spans_refuse_what_is_not_an_offset(tmp_path: Path) -> None:
    with write_tokens(tmp_path / "c", [[1, 2, 3]], dtype=np.uint16) as ds:
        with pytest.raises(TypeError, match="integers"):
            ds.read_spans([0.5], [1])
        with pytest.raises(TypeError, match="integers"):
            ds.read_spans([True], [1])
        with pytest.raises(RecordIndexError):
            ds.read_spans([2**62], [2**62])
        with pytest.raises(RecordIndexError):
            ds.read_spans(np.array([2**64 - 1], np.uint64), [1])
        assert ds.read_spans(np.array([1], np.uint32), [2]).tolist() == [2, 3]


_KILLED_WRITER = """
import sys, time, numpy as np, chute
def docs():
    for _ in range(40):  # 80 MiB of tokens: past the first commit of 64 MiB
        yield np.arange(1 << 20, dtype=np.uint16)
    time.sleep(600)  # the rest never comes: the parent kills us here
    yield np.arange(3, dtype=np.uint16)
chute.write_tokens(sys.argv[1], docs(), progress=False)
"""


def test_a_writer_killed_part_way_leaves_an_incomplete_dataset(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from chute.errors import IncompleteDatasetError

    path = tmp_path / "c"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path)])
    try:
        deadline = time.monotonic() + 120
        while True:  # until the first commit is readable
            try:
                with BytesDataset(path) as raw:
                    if len(raw):
                        break
            except Exception:
                pass
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(IncompleteDatasetError, match="did not finish"):
            TokenDataset(path)  # while the write runs: not yet a stream
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        TokenDataset(path)  # and after its writer died: never a shorter corpus
    write_tokens(path, [[1, 2]], dtype=np.uint16, overwrite=True).close()  # its lock died with it


_KILLED_PARALLEL_WRITER = """
import multiprocessing, sys, time, numpy as np, chute
def docs():
    for i in range(1 << 20):
        if i == 200:  # shards are being written by the pool: name its workers, then stall
            print(*[p.pid for p in multiprocessing.active_children()], flush=True)
            time.sleep(600)
        yield np.arange(300, dtype=np.uint16)
chute.write_tokens(sys.argv[1], docs(), record_tokens=256, shard_records=4, workers=2,
                   progress=False)
"""


def test_a_parallel_writer_killed_takes_its_workers_and_its_lock_along(tmp_path: Path) -> None:
    """Shards written by worker processes: a writer killed outright leaves no worker behind
    holding the dataset's lock (or anything else), so writing again with overwrite works."""
    import subprocess
    import sys
    import time

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        return state not in ("Z", "X")

    path = tmp_path / "c"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_PARALLEL_WRITER, str(path)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        workers = [int(pid) for pid in child.stdout.readline().split()]
    finally:
        child.kill()
        child.wait()
    assert workers
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers)
    write_tokens(path, [[1, 2]], dtype=np.uint16, shard_records=4, overwrite=True).close()
