"""Token windows and packed sequences as loader streams: contents checked against the corpus
itself, and every stream resumed at several steps and on another process count."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from chute import (
    DataLoader,
    PackedTokens,
    RecordStore,
    StoreChangedError,
    TokenDataset,
    TokenWindows,
    mix,
    varlen,
    write_tokens,
)
from chute.loader._packing import pack_group


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[TokenDataset, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 40, 300), rng.integers(100, 700, 60)])
    rng.shuffle(lengths)
    docs = [rng.integers(1, 5000, int(n)).astype(np.uint16) for n in lengths]
    path = tmp_path_factory.mktemp("tokens") / "c"
    return write_tokens(path, docs, record_tokens=96, shard_records=40), docs


def _doc_of(docs: list[np.ndarray]) -> np.ndarray:
    """The document of every token of the stream."""
    return np.repeat(np.arange(len(docs)), [d.size for d in docs])


def _run(loader: DataLoader, steps: int) -> list[dict[str, np.ndarray]]:
    with loader:
        return [next(loader) for _ in range(steps)]


def _same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def _resumes(make, steps: int = 12) -> None:
    """Stopped at several steps and resumed (also on 2 and 3 processes) = uninterrupted."""
    whole = _run(make(None), steps)
    for stop in (1, 5, steps - 1):
        first = make(None)
        with first:
            for _ in range(stop):
                next(first)
            state = first.state_dict()
        again = make(None)
        again.load_state_dict(state)
        assert _same(_run(again, steps - stop), whole[stop:])
    for count in (2, 4):
        parts = []
        for index in range(count):
            loader = make((index, count))
            loader.load_state_dict(make(None).state_dict() | {"step": 3})
            parts.append(_run(loader, steps - 3))
        joined = [{k: np.concatenate([p[s][k] for p in parts]) for k in whole[0]}
                  for s in range(steps - 3)]  # fmt: skip
        assert _same(joined, whole[3:])


# ---- windows ------------------------------------------------------------------------------


def test_windows_are_the_stream_cut_in_order(corpus) -> None:
    ds, docs = corpus
    stream = np.concatenate(docs)
    windows = TokenWindows(ds, seq_len=50)
    assert len(windows) == (stream.size - 1) // 50
    got = windows.__getitems__(np.arange(len(windows), dtype=np.uint64))["tokens"]
    for w in range(len(windows)):
        assert np.array_equal(got[w], stream[w * 50 : w * 50 + 51])


def test_an_epoch_of_windows_is_a_permutation(corpus) -> None:
    ds, _ = corpus
    windows = TokenWindows(ds, seq_len=64)
    per_epoch = len(windows) // 8
    firsts = [b["tokens"][:, 0] for b in _run(DataLoader(windows, batch_size=8, seed=3),
                                               2 * per_epoch)]  # fmt: skip
    stream = ds.tokens(0, ds.num_tokens)
    starts = {int(i) for i in range(0, len(windows) * 64, 64)}
    for epoch in (0, 1):
        seen = np.concatenate(firsts[epoch * per_epoch : (epoch + 1) * per_epoch])
        assert len(seen) == per_epoch * 8
        assert set(seen.tolist()) <= {int(stream[s]) for s in starts}
    assert not np.array_equal(np.concatenate(firsts[:per_epoch]),
                              np.concatenate(firsts[per_epoch:]))  # fmt: skip


def test_windows_with_documents_mark_every_document_start(corpus) -> None:
    ds, docs = corpus
    doc = _doc_of(docs)
    windows = TokenWindows(ds, seq_len=40, documents=True)
    batch = windows.__getitems__(np.arange(len(windows), dtype=np.uint64))
    for w in range(len(windows)):
        owners = doc[w * 40 : w * 40 + 41]
        changes = np.concatenate([[1], (np.diff(owners) != 0).astype(int)])
        assert np.array_equal(batch["segment_ids"][w], np.cumsum(changes))
        starts = np.flatnonzero(changes)
        want = np.arange(41) - starts[np.searchsorted(starts, np.arange(41), "right") - 1]
        assert np.array_equal(batch["positions"][w], want)


@pytest.mark.parametrize("documents", [False, True])
def test_windows_resume_exactly(corpus, documents: bool) -> None:
    ds, _ = corpus
    windows = TokenWindows(ds, seq_len=32, documents=documents)
    _resumes(lambda shard: DataLoader(windows, batch_size=12, seed=5, shard=shard))


def test_windows_refuse_a_stream_too_short(tmp_path: Path) -> None:
    with write_tokens(tmp_path / "c", [[1, 2, 3]], dtype=np.uint16) as ds:
        with pytest.raises(ValueError, match="no window"):
            TokenWindows(ds, seq_len=3)
        with pytest.raises(TypeError, match="TokenDataset"):
            TokenWindows(np.arange(10), seq_len=3)  # type: ignore[arg-type]


# ---- packing ------------------------------------------------------------------------------


def _all_rows(packed: PackedTokens) -> dict[str, np.ndarray]:
    return packed.__getitems__(np.arange(len(packed), dtype=np.uint64))


@pytest.mark.parametrize(("seq_len", "group"), [(64, 8), (100, 3), (700, 2), (16, 1)])
def test_packing_places_every_token_once_and_keeps_short_documents_whole(
    corpus, seq_len: int, group: int
) -> None:
    ds, docs = corpus
    stream = np.concatenate(docs)
    doc = _doc_of(docs)
    packed = PackedTokens(ds, seq_len=seq_len, group=group)
    rows = _all_rows(packed)
    real = rows["segment_ids"] != 0
    assert real.sum() == stream.size  # every token once: no loss, no repeat
    full_rows = (stream.size // (seq_len * group)) * group
    assert real[:full_rows].all()  # padding only in the last group, less than a sequence
    assert (~real).sum() < seq_len
    seen: list[int] = []
    split: set[int] = set()
    for b in range(len(packed)):
        g, k = divmod(b, group)
        p = packed.packing(g)
        lo, hi = p.edges[k], p.edges[k + 1]
        pieces = list(zip(p.starts[lo:hi].tolist(), p.lengths[lo:hi].tolist(), strict=True))
        at = 0
        for number, (s, n) in enumerate(pieces, start=1):
            assert np.array_equal(rows["tokens"][b, at : at + n], stream[s : s + n])
            assert (rows["segment_ids"][b, at : at + n] == number).all()
            assert np.array_equal(rows["positions"][b, at : at + n], np.arange(n))
            assert len(set(doc[s : s + n].tolist())) == 1  # a piece is of one document
            if n < docs[doc[s]].size:
                split.add(int(doc[s]))
            seen.extend(range(s, s + n))
            at += n
        assert (rows["segment_ids"][b, at:] == 0).all()
    assert sorted(seen) == list(range(stream.size))
    span = seq_len * group
    starts = np.cumsum([0] + [d.size for d in docs[:-1]])
    inside = [
        i
        for i, d in enumerate(docs)
        if d.size <= seq_len and starts[i] // span == (starts[i] + d.size - 1) // span
    ]
    whole = [i for i in inside if i not in split]
    assert len(whole) >= 0.9 * len(inside)  # only a few fill gaps


def test_pack_group_fills_exactly() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        seq_len, bins = int(rng.integers(1, 50)), int(rng.integers(1, 9))
        total = seq_len * bins
        starts = np.unique(np.concatenate([[0], rng.integers(0, total, rng.integers(0, 20))]))
        p = pack_group(1000, 1000 + total, starts + 1000, seq_len, bins)
        per_bin = np.add.reduceat(p.lengths, p.edges[:-1]) if p.lengths.size else []
        assert np.array_equal(per_bin, np.full(bins, seq_len))
        covered = np.concatenate(
            [np.arange(s, s + n) for s, n in zip(p.starts, p.lengths, strict=True)]
        )
        assert np.array_equal(np.sort(covered), np.arange(1000, 1000 + total))


def test_packing_is_the_same_after_the_cache_and_in_a_copy(corpus) -> None:
    ds, _ = corpus
    packed = PackedTokens(ds, seq_len=64, group=4)
    rows = np.array([5, 0, 17, 5, len(packed) - 1], np.uint64)
    first = packed.__getitems__(rows)
    copy = pickle.loads(pickle.dumps(packed))
    again = copy.__getitems__(rows)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    copy.tokens.close()


def test_packing_resumes_exactly(corpus) -> None:
    ds, _ = corpus
    packed = PackedTokens(ds, seq_len=48, group=4)
    _resumes(lambda shard: DataLoader(packed, batch_size=8, seed=2, shard=shard))


def test_packing_in_worker_processes_is_the_same(corpus) -> None:
    ds, _ = corpus
    packed = PackedTokens(ds, seq_len=48, group=4)
    threads = _run(DataLoader(packed, batch_size=8, seed=2), 6)
    workers = _run(DataLoader(packed, batch_size=8, seed=2, workers=2), 6)
    assert _same(threads, workers)


def test_varlen_drops_padding_and_marks_segments(corpus) -> None:
    ds, _ = corpus
    packed = PackedTokens(ds, seq_len=64, group=8)
    rows = _all_rows(packed)
    flat = varlen(rows)
    real = rows["segment_ids"] != 0
    assert np.array_equal(flat["tokens"], rows["tokens"][real])
    cu = flat["cu_seqlens"]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == real.sum()
    assert flat["max_seqlen"] == int(np.diff(cu).max()) <= 64
    assert (flat["positions"][cu[:-1]] == 0).all()
    assert np.count_nonzero(flat["positions"] == 0) == cu.size - 1
    with DataLoader(packed, batch_size=4, seed=0, transform=varlen) as loader:
        batch = next(loader)
        assert set(batch) == {"tokens", "positions", "cu_seqlens", "max_seqlen"}


def test_varlen_needs_segment_ids_and_positions(corpus) -> None:
    batch = TokenWindows(corpus[0], 16).__getitems__(np.arange(2))
    with pytest.raises(ValueError, match=r"segment ids and positions.*\['tokens'\]"):
        varlen(batch)
    packed = PackedTokens(corpus[0], 16).__getitems__(np.arange(2))
    with pytest.raises(ValueError, match="n, seq_len"):
        varlen({**packed, "segment_ids": packed["segment_ids"][:, :8]})


def test_a_packed_batch_larger_than_a_pass_is_refused(corpus) -> None:
    packed = PackedTokens(corpus[0], 16)
    with pytest.raises(ValueError, match=r"more than the \d+ records of a pass"):
        DataLoader(packed, batch_size=len(packed) + 1, seed=0)


def test_a_stream_alone_must_gather_a_dict() -> None:
    class Squares:
        def __len__(self) -> int:
            return 10

        def __getitems__(self, indices: np.ndarray) -> np.ndarray:
            return indices**2

    with (
        DataLoader(Squares(), batch_size=2, sampler="sequential") as loader,
        pytest.raises(TypeError, match="dict of named arrays"),
    ):
        next(loader)
    with pytest.raises(ValueError, match="non-empty dict"):
        DataLoader(np.arange(10), batch_size=2)  # type: ignore[arg-type]


def test_a_pass_of_packed_sequences_packs_each_group_once(corpus, monkeypatch) -> None:
    import chute.loader._tokens as module

    ds, _ = corpus
    packed = PackedTokens(ds, seq_len=40, group=4, lanes=8)
    packs: list[int] = []
    real = module.pack_groups

    def counted(starts, *rest):
        packs.extend(starts.tolist())
        return real(starts, *rest)

    monkeypatch.setattr(module, "pack_groups", counted)
    n = len(packed)
    with DataLoader(packed, batch_size=6, seed=1) as loader:
        sampler = loader.sampler  # the stream's own order
        drawn = np.concatenate([sampler.indices(s) for s in range(-(-2 * n // 6))])
        next(loader)
    one, two = drawn[:n], drawn[n : 2 * n]
    fresh = PackedTokens(ds, seq_len=40, group=4, lanes=8)
    packs.clear()
    for k in range(0, n, 6):  # one pass, in the order the loader reads it
        fresh.__getitems__(one[k : k + 6])
    assert sorted(one.tolist()) == list(range(n)) == sorted(two.tolist())
    assert not np.array_equal(one, two)  # a fresh order each pass
    assert len(packs) == len(set(packs)) == -(-n // 4)  # every group packed once in the pass
    groups = one[: (n // 4 // 8) * 32] // 4  # whole blocks of 8 lanes
    for k in range(0, groups.size - 8, 8):
        assert len(set(groups[k : k + 8].tolist())) == 8  # 8 draws in a row: 8 groups


@pytest.mark.parametrize("kind", ["windows", "packed"])
def test_the_last_steps_can_be_read(corpus, kind: str) -> None:
    ds, _ = corpus
    stream = TokenWindows(ds, 32) if kind == "windows" else PackedTokens(ds, 32, group=4)
    with DataLoader(stream, batch_size=8, seed=2**64 - 1, start_step=2**64 - 3) as loader:
        first, second = next(loader), next(loader)
        assert (
            first["tokens"].shape == second["tokens"].shape == (8, 33 if kind == "windows" else 32)
        )
        with pytest.raises(StopIteration):
            next(loader)


def test_packing_from_many_threads_at_once(corpus) -> None:
    from concurrent.futures import ThreadPoolExecutor

    ds, _ = corpus
    rng = np.random.default_rng(3)
    asks = [rng.integers(0, 600, 24).astype(np.uint64) for _ in range(64)]
    want = [PackedTokens(ds, 48, group=4, lanes=2).__getitems__(a) for a in asks]
    shared = PackedTokens(ds, 48, group=4, lanes=2)  # a small cache: packs evicted and redone
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(shared.__getitems__, asks))
    assert all(np.array_equal(g[k], w[k]) for g, w in zip(got, want, strict=True) for k in w)


def test_packed_order_drawn_a_block_at_a_time_is_the_streams_order(corpus) -> None:
    """The loader's sampler draws a packed stream's lane order 8192 draws at a time: each
    step's batch is still exactly the stream's own ``order`` for that step's draws."""
    ds, _ = corpus
    for seq_len, batch in ((40, 3), (40, 100), (2, 9000)):  # a batch past a block of draws
        packed = PackedTokens(ds, seq_len, group=4, lanes=8)
        assert batch <= len(packed)
        sampler = packed.sampler(batch, 5, "cyclic")
        assert sampler is not None
        for step in (0, 1, 8192 // batch, 8192 // batch + 1, 10**9):
            want = packed.order(sampler.seed, step * batch, batch)
            assert np.array_equal(sampler.indices(step), want), (batch, step)


def test_window_and_sequence_numbers_must_be_integers(
    corpus: tuple[TokenDataset, list[np.ndarray]],
) -> None:
    """Floats, booleans and strings are refused as record indices are (no silent truncation
    of 0.5 to window 0); integer arrays of any shape or stride are read."""
    from chute import mix

    ds, _docs = corpus
    windows, packed = TokenWindows(ds, 16), PackedTokens(ds, 16, group=4)
    mixture = mix({"a": windows, "b": TokenWindows(ds, 16)}, {"a": 1, "b": 1})
    for stream in (windows, packed, mixture):
        for bad in ([0.5], [True, False], ["1"]):
            with pytest.raises(TypeError, match="integers"):
                stream.__getitems__(bad)  # type: ignore[arg-type]
        strided = np.arange(8, dtype=np.uint64)[::2]
        want = stream.__getitems__(np.array([0, 2, 4, 6]))["tokens"]
        assert np.array_equal(stream.__getitems__(strided)["tokens"], want)
        assert stream.__getitems__(np.array([[3], [1]]))["tokens"].shape[0] == 2


def test_packed_rows_past_the_stream_are_index_errors_cached_or_not(tmp_path) -> None:
    docs = [np.full(n, n, np.uint16) for n in (5, 9, 3, 12, 7, 4)]
    packed = PackedTokens(write_tokens(tmp_path / "c", docs), seq_len=4, group=3)
    last = len(packed) - 1
    for _ in range(2):  # the second time every group is packed and kept
        for bad in ([len(packed)], [0, last + 1], [-1], [10**12]):
            with pytest.raises(IndexError, match=rf"a sequence outside \[0, {len(packed)}\)"):
                packed.__getitems__(np.array(bad))
        assert packed.__getitems__(np.arange(len(packed)))["tokens"].shape == (len(packed), 4)


def test_streams_over_a_store_compacted_since_refuse_to_read(tmp_path) -> None:
    # records read where they lie are checked against the store's generation after the read
    docs = [np.arange(100) % 50 + 1, np.arange(70) % 30 + 1]
    ds = write_tokens(tmp_path / "t", docs, dtype=np.uint16)
    other = write_tokens(tmp_path / "u", docs, dtype=np.uint16)
    windows, packed = TokenWindows(ds, 8), PackedTokens(ds, 8, group=2)
    mixed = mix({"a": TokenWindows(other, 8), "b": windows}, {"a": 0.5, "b": 0.5})
    rows = np.array([0, 3])
    for stream in (windows, packed, mixed):
        stream.__getitems__(rows)
    with RecordStore(tmp_path / "t", mode="a") as store:
        store.compact()  # the same records, a new generation
    for stream in (windows, packed):
        with pytest.raises(StoreChangedError, match="reopen"):
            stream.__getitems__(rows)
    with pytest.raises(StoreChangedError, match="reopen"):
        mixed.__getitems__(np.arange(len(mixed)))  # both sources: the changed one refuses
