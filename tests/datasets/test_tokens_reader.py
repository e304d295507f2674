"""The token reader in the compiled core: the same tokens, document starts, windows, packed
rows and mixtures whether records are read in place (a local store, raw or zstd, with or
without checksums) or gathered first (shards), packing equal to a plain reference, and
hostile arguments refused with an exception, never a signal."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chute import PackedTokens, TokenDataset, TokenWindows, mix, write_tokens
from chute.loader._packing import pack_group


def _docs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 30, 200), rng.integers(200, 900, 30)])
    rng.shuffle(lengths)
    return [rng.integers(1, 60000, int(n)).astype(np.uint16) for n in lengths]


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TokenDataset]:
    """One corpus stored four ways: read in place raw, in place decoded, in place with
    checksums checked, and gathered from shards."""
    docs = _docs(0)
    root = tmp_path_factory.mktemp("reader")
    made = {
        "raw": write_tokens(root / "raw", docs, record_tokens=64),
        "zstd": write_tokens(root / "zstd", docs, record_tokens=64, codec="zstd"),
        "shards": write_tokens(root / "shards", docs, record_tokens=64, shard_records=7),
    }
    made["verified"] = TokenDataset(root / "raw", verify=True)
    return made


def _same_batches(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def test_every_way_of_reading_gives_the_same_tokens_and_starts(copies) -> None:
    docs = _docs(0)
    stream = np.concatenate(docs)
    starts = np.cumsum([0] + [d.size for d in docs[:-1]])
    rng = np.random.default_rng(1)
    lo = rng.integers(0, stream.size, 200)
    count = rng.integers(0, 700, 200).clip(max=stream.size - lo)
    want = np.concatenate([stream[a : a + n] for a, n in zip(lo, count, strict=True)])
    for name, ds in copies.items():
        assert np.array_equal(ds.read_spans(lo, count), want), name
        tokens, begins, counts = ds.read_spans_documents(lo, count)
        assert np.array_equal(tokens, want), name
        inside = [starts[(starts >= a) & (starts < a + n)] for a, n in zip(lo, count, strict=True)]
        assert np.array_equal(counts, [x.size for x in inside]), name
        assert np.array_equal(begins, np.concatenate(inside)), name
        assert np.array_equal(ds.document_starts(0, ds.num_tokens), starts), name


@pytest.mark.parametrize("documents", [False, True])
def test_windows_mixtures_and_packing_agree_across_the_ways(copies, documents: bool) -> None:
    reference = copies["raw"]
    rng = np.random.default_rng(2)
    for name, ds in copies.items():
        windows = TokenWindows(ds, 50, documents=documents)
        pick = rng.integers(0, len(windows), 40).astype(np.uint64)
        plain = TokenWindows(reference, 50, documents=documents)
        _same_batches(windows.__getitems__(pick), plain.__getitems__(pick))
        both = mix({"a": windows, "b": plain}, [1, 2])
        pick = rng.integers(0, len(both), 40).astype(np.uint64)
        batch = both.__getitems__(pick)
        assert np.array_equal(batch["source"], (pick >= len(windows)).astype(np.int16)), name
        local = np.where(pick >= len(windows), pick - len(windows), pick)
        rest = {k: v for k, v in batch.items() if k != "source"}
        _same_batches(rest, plain.__getitems__(local))
        packed = PackedTokens(ds, 64, group=5, lanes=3)
        pick = rng.integers(0, len(packed), 40).astype(np.uint64)
        _same_batches(packed.__getitems__(pick),
                      PackedTokens(reference, 64, group=5, lanes=3).__getitems__(pick))  # fmt: skip


def test_packed_rows_are_their_packing(copies) -> None:
    """Each row is its packing's pieces of the stream, end to end, then padding; segment ids
    count the pieces from 1, positions count from 0 in each."""
    ds = copies["shards"]
    stream = ds.tokens(0, ds.num_tokens)
    packed = PackedTokens(ds, 48, group=6)
    batch = packed.__getitems__(np.arange(len(packed)))
    for row in range(len(packed)):
        p = packed.packing(row // 6)
        b = row % 6
        at = slice(p.edges[b], p.edges[b + 1])
        pieces = list(zip(p.starts[at].tolist(), p.lengths[at].tolist(), strict=True))
        tokens = np.concatenate([stream[s : s + n] for s, n in pieces] + [np.zeros(0, np.uint16)])
        fill = tokens.size
        assert np.array_equal(batch["tokens"][row, :fill], tokens)
        assert not batch["tokens"][row, fill:].any() and not batch["segment_ids"][row, fill:].any()
        ids = np.repeat(np.arange(1, len(pieces) + 1), [n for _, n in pieces])
        assert np.array_equal(batch["segment_ids"][row, :fill], ids)
        where = np.concatenate([np.arange(n) for _, n in pieces] + [np.zeros(0, int)])
        assert np.array_equal(batch["positions"][row, :fill], where)


@pytest.mark.parametrize("way", ["raw", "shards"])
def test_windows_and_mixtures_outside_their_range_are_index_errors(copies, way: str) -> None:
    windows = TokenWindows(copies[way], 50)
    for bad in ([len(windows)], [-1], np.array([2**64 - 1], np.uint64), [3, len(windows) + 9]):
        with pytest.raises(IndexError, match="outside the stream's windows"):
            windows.__getitems__(bad)
    both = mix({"a": windows, "b": windows}, [1, 1])
    for bad in ([len(both)], [-1], [5, 2 * len(both)]):
        with pytest.raises(IndexError, match="outside the stream's windows"):
            both.__getitems__(bad)
    assert both.__getitems__(np.empty(0, np.uint64))["tokens"].shape == (0, 51)


# ---- packing against a plain reference -----------------------------------------------------


def _reference(start: int, stop: int, begins: list[int], seq_len: int, bins: int) -> list:
    """The packing rule written plainly: whole sequences of each piece first, then short
    documents first-fit-decreasing, then the rest split across the gaps in order."""
    marks = sorted({start, stop} | {b for b in begins if start < b < stop})
    rows, intact, rest = [], [], []
    for a, b in itertools.pairwise(marks):
        whole, tail = divmod(b - a, seq_len)
        rows += [[(a + k * seq_len, seq_len)] for k in range(whole)]
        if tail:
            keep = whole == 0 and a in begins and (b in begins or b < stop)
            (intact if keep else rest).append((a + whole * seq_len, tail))
    room = [seq_len] * (bins - len(rows))
    placed: list[list] = [[] for _ in room]
    left = []
    for s, n in sorted(intact, key=lambda p: (-p[1], p[0])):
        fits = [b for b in range(len(room)) if room[b] >= n]
        if fits:
            placed[fits[0]].append((s, n))
            room[fits[0]] -= n
        else:
            left.append((s, n))
    b = 0
    for s, n in rest + left:
        while n:
            while room[b] == 0:
                b += 1
            take = min(n, room[b])
            placed[b].append((s, take))
            room[b] -= take
            s, n = s + take, n - take
    return rows + placed


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=30),
    seq_len=st.integers(1, 40),
    cut=st.integers(0, 30),
    begins_at_stop=st.booleans(),
)
def test_packing_is_the_reference_rule(
    lengths: list[int], seq_len: int, cut: int, begins_at_stop: bool
) -> None:
    starts = np.cumsum([0, *lengths])
    start = min(cut, int(starts[-1]) - 1)  # the group may begin inside a document
    stop = int(starts[-1])
    begins = [int(s) for s in starts[:-1] if s >= start] + ([stop] if begins_at_stop else [])
    bins = -(-(stop - start) // seq_len) + 2
    p = pack_group(start, stop, np.array(begins, np.int64), seq_len, bins)
    got = [list(zip(p.starts[p.edges[b] : p.edges[b + 1]].tolist(),
                    p.lengths[p.edges[b] : p.edges[b + 1]].tolist(), strict=True))
           for b in range(bins)]  # fmt: skip
    assert got == [list(r) for r in _reference(start, stop, begins, seq_len, bins)]


def test_a_packing_that_cannot_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        pack_group(0, 100, np.array([0, 100], np.int64), seq_len=10, bins=5)
    with pytest.raises(ValueError, match="rising"):
        pack_group(0, 10, np.array([5, 3], np.int64), seq_len=10, bins=1)


# ---- hostile arguments ---------------------------------------------------------------------

_HOSTILE = """
import numpy as np, sys
from chute import TokenDataset
from chute._native import read_tokens, read_windows, read_packed, pack_groups
ds = TokenDataset(sys.argv[1])
where = ds._in_place().where
src = (ds._params, where)
i8 = lambda *v: np.array(v, np.int64)
out = np.empty(64, np.uint16)
calls = [
    lambda: read_tokens([src], None, i8(0), i8(64), out[:10], None, 1),             # out short
    lambda: read_tokens([src], None, i8(0), i8(4), out[::2], None, 1),             # strided
    lambda: read_tokens([src], None, i8(0), i8(4), np.empty(8, object), None, 1),  # objects
    lambda: read_tokens([src], None, i8(0), i8(4), out.copy().setflags(write=False) or
                        np.frombuffer(bytes(128), np.uint16), None, 1),             # read-only
    lambda: read_tokens([src], None, i8(0, 0), i8(4), out, None, 1),                # len short
    lambda: read_tokens([src], None, np.zeros(2, np.int32), i8(4), out, None, 1),    # int32 lo
    lambda: read_tokens([src], None, np.zeros(17, np.uint8)[1:].view(np.int64), i8(1, 1),
                        out, None, 1),                                              # misaligned
    lambda: read_tokens([src], np.array([5], np.int32), i8(0), i8(4), out, None, 1),  # which
    lambda: read_tokens([src], None, i8(-5), i8(4), out, None, 1),                  # negative
    lambda: read_tokens([src], None, i8(2**62), i8(2**62), out, None, 1),           # huge
    lambda: read_tokens([src], None, i8(0, 1), i8(2**63 - 1, 2**63 - 1), out, None, 1),
    lambda: read_tokens([((64, 2**41, 1, 1), where)], None, i8(0), i8(4), out, None, 1),
    lambda: read_tokens([((0, 1, 1, 1), where)], None, i8(0), i8(1), out, None, 1),
    lambda: read_tokens([((64, 1, 65, 1), where)], None, i8(0), i8(1), out, None, 1),
    lambda: read_tokens([((64, 9, 64, 3), where)], None, i8(0), i8(1), out, None, 1),
    lambda: read_tokens([((64, 10**6, 64, 1), where)], None, i8(64 * 999_000), i8(4), out,
                        None, 1),                                                   # no record
    lambda: read_tokens([(ds._params, (where[0][:1], *where[1:]))], None, i8(100), i8(4),
                        out, None, 1),                                              # short table
    lambda: read_tokens([(ds._params, (where[0], where[1] * 0 + 2**40, *where[2:]))], None,
                        i8(0), i8(4), out, None, 1),                                # limits
    lambda: read_tokens([(ds._params, (b"x" * 40, i8(0, 40), i8(0)))], None, i8(0), i8(4),
                        out, None, 1),                                              # no header
    lambda: read_tokens([(ds._params, (b"x" * 40, i8(0, 400), i8(0)))], None, i8(0), i8(4),
                        out, None, 1),                                              # offsets
    lambda: read_tokens([(ds._params, (b"x" * 40, i8(0, 20, 40), i8(1, 0)))], None, i8(0),
                        i8(4), out, None, 1),                                       # not rising
    lambda: read_tokens([(ds._params, (1, 2))], None, i8(0), i8(4), out, None, 1),
    lambda: read_tokens([5], None, i8(0), i8(4), out, None, 1),                    # not a pair
    lambda: read_tokens([(5, src[1])], None, i8(0), i8(4), out, None, 1),          # no params
    lambda: read_tokens([], None, i8(0), i8(4), out, None, 1),
    lambda: read_tokens([src], None, i8(0), i8(4), out, np.empty(1, np.int32), 1),
    lambda: read_windows([src], None, np.array([10**9], np.uint64), 10, out, None, None, 1),
    lambda: read_windows([src], i8(0, 5), np.array([7], np.uint64), 10, out, None, None, 1),
    lambda: read_windows([src], None, np.array([0], np.uint64), 0, out, None, None, 1),
    lambda: read_windows([src], None, np.array([0], np.uint64), 10, out[:3], None, None, 1),
    lambda: read_windows([src], i8(0, 5), np.array([1], np.uint64), 10, out,
                         np.empty(1, np.int64), None, 1),                           # int64 src
    lambda: pack_groups(i8(0), i8(10), i8(0), i8(), i8(0), 4),                      # no bins
    lambda: pack_groups(i8(0), i8(10), i8(1), i8(), i8(5), 4),                      # counts
    lambda: pack_groups(i8(10), i8(0), i8(1), i8(), i8(0), 4),                      # backwards
    lambda: pack_groups(i8(0), i8(10), i8(1), i8(3, 2), i8(2), 40),                 # not rising
    lambda: read_packed(src, {0: i8(1, 0, 2, 0, 4).tobytes()}, i8(0), 1, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # edges
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 99).tobytes()}, i8(0), 1, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # overflow
    lambda: read_packed(src, {0: i8(1, 0, 1, 10**9, 4).tobytes()}, i8(0), 1, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # outside
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 4).tobytes()}, i8(1), 1, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # which
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 4).tobytes()}, i8(3), 4, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # row
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 4).tobytes()}, i8(0), 1, out,
                        np.empty(8, np.int32), np.empty(64, np.int32), 1),          # ids short
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 4).tobytes()}, i8(-1), 1, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # negative
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 4).tobytes()}, i8(0), 0, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # group 0
    lambda: read_packed(src, {0: i8(1, 0, 1, 0, 4).tobytes()}, i8(0, 0, 0, 0)[::2], 1, out,
                        np.empty(64, np.int32), np.empty(64, np.int32), 1),         # strided
]
for k, call in enumerate(calls):
    try:
        got = call()
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, AttributeError):
        continue
    assert isinstance(got, tuple) and got[0] != 0, (k, got)  # refused by a code
good = {0: i8(1, 0, 1, 0, 4).tobytes()}
ids, where = np.empty(64, np.int32), np.empty(64, np.int32)
assert read_packed(src, good, i8(0), 1, out, ids, where, 1)[0] == 0  # the control
bad_tables = [{0: "table"}, {0: i8(1, 0, 1, 0, 4)}, {0: b"x" * 39}, {0: i8(1, 0, 1, 0).tobytes()},
              {0: i8(1, 0, 2, 0, 4).tobytes()}, {0: i8(2, 0, 2, 1, 5, 1).tobytes()}]
for bad in [[good], *bad_tables]:
    try:
        read_packed(src, bad, i8(0), 1, out, ids, where, 1)
    except (ValueError, TypeError, IndexError):
        continue
    raise AssertionError(bad)
print("refused", len(calls))
"""


def test_hostile_arguments_are_refused_in_a_child(copies) -> None:
    """Every bad buffer, span, table or source is an exception or an error code: the child
    would die of a signal otherwise."""
    path = str(copies["raw"]._path)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_HOSTILE), path],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused" in done.stdout
