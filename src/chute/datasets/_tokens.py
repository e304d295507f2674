"""`TokenDataset`: documents of tokens as one stream, in records of a fixed number of tokens.

A language-model corpus is billions of tokens in documents of any length. Stored one record
per document, a long document would meet the format's 1 MiB record cap; stored as one array,
document boundaries would be lost. A token dataset cuts the concatenated stream into records
of ``record_tokens`` tokens each (the last one shorter) and keeps, in each record, where the
documents that begin in it begin. Token ``t`` is then in record ``t // record_tokens``: any
span of the stream is a few records away, and a document is no longer bounded by the cap.

The records are bytes records of an ordinary dataset (one store or sharded, on local disk or
in object storage), each laid out as

* a 32-byte little-endian header (`HEADER`): ``b"CTOK"``, the layout version, the token
  dtype's code, flags (`FINAL` on the stream's last record only), ``record_tokens``, this
  record's token count, its count of document starts, and the stream offset of its first
  token;
* its tokens (``uint16`` or ``uint32``, little-endian);
* the offsets, within the record, of the documents that begin in it (``uint32``, rising).

Every record read is checked against what its place in the stream must hold, so a damaged,
reordered or foreign record is a `CorruptStoreError`, never other tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

import numpy as np
import numpy.typing as npt

from chute._native import codes, read_packed, read_tokens
from chute._util.checks import check_int
from chute.datasets._bytes import _BYTES
from chute.datasets._view import StoreView
from chute.errors import (
    CorruptStoreError,
    IncompleteDatasetError,
    RecordIndexError,
    StoreKindError,
)
from chute.store._internal import MAX_RECORD, InPlace, as_indices, check_in_place

__all__ = [
    "FINAL",
    "HEADER",
    "MAGIC",
    "TOKEN_DTYPES",
    "Packing",
    "TokenDataset",
    "TokenRead",
    "max_record_tokens",
    "native_read",
    "positions_of",
    "ranges",
    "read_packed_rows",
    "read_token_spans",
]

MAGIC = b"CTOK"
VERSION = 1
HEADER = np.dtype(
    [
        ("magic", "S4"),
        ("version", "u1"),
        ("dtype", "u1"),
        ("flags", "<u2"),
        ("record_tokens", "<u4"),
        ("tokens", "<u4"),
        ("starts", "<u4"),
        ("reserved2", "<u4"),
        ("first", "<u8"),
    ]
)
"""A token record's header; its size (32 bytes) keeps the tokens after it aligned."""
FINAL = 1
"""The flag of the stream's last record: a store without it at its end is a write that did
not finish (a single store commits its records as they come)."""
TOKEN_DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
"""The token dtypes a record may hold, by their code in the header."""
_START = np.dtype("<u4")
_HIGH, _LOW = np.uint64(32), np.uint64(0xFFFFFFFF)


def max_record_tokens(dtype: np.dtype[Any]) -> int:
    """The most tokens a record of ``dtype`` can hold within the 1 MiB record cap, were every
    token the start of a document."""
    return (MAX_RECORD - HEADER.itemsize) // (dtype.itemsize + _START.itemsize)


def ranges(starts: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, without the loop.

    >>> ranges(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    total = int(counts.sum())
    before = np.cumsum(counts) - counts
    return np.repeat(starts - before, counts) + np.arange(total, dtype=np.int64)


def _length_of(
    tokens: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], dtype: np.dtype[Any]
) -> npt.NDArray[np.int64]:
    """The bytes of token records holding ``tokens`` tokens and ``starts`` document starts."""
    return HEADER.itemsize + tokens * dtype.itemsize + _START.itemsize * starts


def _offsets(values: npt.ArrayLike, what: str) -> npt.NDArray[np.int64]:
    """Integer offsets as a flat int64 array; anything else (floats, bools) refused."""
    array = np.asarray(values)
    if array.size and (array.dtype.kind not in "iu" or array.dtype == np.bool_):
        raise TypeError(f"{what} must be integers, got {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise RecordIndexError(f"{what} past any stream: {int(array.max())}")
    return array.astype(np.int64, copy=False).reshape(-1)


class TokenDataset(StoreView):
    """A corpus of token documents written by `chute.write_tokens`, read as one stream.

    ``len(ds)`` is the number of documents and ``ds[i]`` document i; ``ds.tokens(a, b)`` is
    tokens ``a:b`` of the whole stream, across document and record edges;
    ``ds.document_starts(a, b)`` the stream offsets where documents begin in ``a:b``. Windows
    and packed sequences for the step loader are `chute.TokenWindows` and
    `chute.PackedTokens` over it.

    >>> import tempfile, numpy as np
    >>> from chute import TokenDataset, write_tokens
    >>> path = tempfile.mkdtemp() + "/corpus"
    >>> docs = [np.arange(5), np.arange(100, 103), np.arange(200, 210)]
    >>> write_tokens(path, docs, dtype=np.uint16, record_tokens=4).close()
    >>> with TokenDataset(path) as ds:
    ...     len(ds), ds.num_tokens, ds[1].tolist(), ds.tokens(3, 9).tolist()
    (3, 18, [100, 101, 102], [3, 4, 100, 101, 102, 200])
    """

    _ragged = True
    _bare = _BYTES

    def _check(self) -> None:
        if self._schema.dtype.itemsize != 1 or self._item_shape != ():
            raise StoreKindError(f"{self._path} holds {self._schema.describe()}, not token records")
        n = len(self._store)
        if n == 0:
            raise IncompleteDatasetError(
                f"{self._path} holds no records: a token dataset whose write did not finish "
                "(or is still running), or an empty bytes dataset"
            )
        self._lock = threading.Lock()
        self._documents: npt.NDArray[np.int64] | None = None  # documents before each record
        ends = np.unique(np.array([0, n - 1], np.int64))
        values, offsets = self._store.gather_packed(ends)
        if int(offsets[1]) < HEADER.itemsize or bytes(values[:4]) != MAGIC:
            raise StoreKindError(
                f"{self._path} is a bytes dataset, not a token dataset (written by "
                "chute.write_tokens): open it with BytesDataset"
            )
        head = values[: HEADER.itemsize].view(HEADER)[0]
        code = int(head["dtype"])
        if int(head["version"]) != VERSION or code not in TOKEN_DTYPES:
            raise CorruptStoreError(
                f"{self._path}: token records of layout version {int(head['version'])}, dtype "
                f"code {code}; this chute reads version {VERSION}, codes {sorted(TOKEN_DTYPES)}"
            )
        self._token_dtype = TOKEN_DTYPES[code]
        self._code = code
        self._record_tokens = int(head["record_tokens"])
        if not 1 <= self._record_tokens <= max_record_tokens(self._token_dtype):
            self._damaged(0, f"record_tokens {self._record_tokens}")
        self._records = n
        last = int(offsets[-2])
        tail = values[last : last + HEADER.itemsize].view(HEADER)[0]
        if not int(tail["flags"]) & FINAL:
            raise IncompleteDatasetError(
                f"{self._path}: its last record does not end the token stream: the write of "
                "this token dataset did not finish (or records were added after it); write it "
                "again with overwrite=True"
            )
        self._last_tokens = int(tail["tokens"])
        if not 1 <= self._last_tokens <= self._record_tokens:
            self._damaged(n - 1, f"{self._last_tokens} tokens")
        self._num_tokens = (n - 1) * self._record_tokens + self._last_tokens
        self._params = (self._record_tokens, n, self._last_tokens, code)  # the reader's terms
        self._in_place = getattr(self._store, "in_place", None)  # local stores have one
        self._placed: tuple[InPlace, tuple[Any, Any]] | None = None

    def _damaged(self, record: Any, what: str) -> NoReturn:
        raise CorruptStoreError(
            f"{self._path}: record {int(record)} is not the token record its place in the "
            f"stream holds ({what}); the dataset is damaged"
        )

    def _explain(
        self, records: npt.NDArray[np.int64], heads: npt.NDArray[Any], lengths: npt.NDArray[Any]
    ) -> NoReturn:
        """Name the first thing wrong with the headers a fast check refused."""
        size = self._record_tokens
        want = np.where(records == self._records - 1, self._last_tokens, size)
        tokens = heads["tokens"].astype(np.int64)
        starts = heads["starts"].astype(np.int64)
        problems = [
            (heads["magic"] != MAGIC, "no token header"),
            (heads["version"] != VERSION, "another layout version"),
            (heads["dtype"] != self._code, "another token dtype"),
            (
                heads["flags"] != np.where(records == self._records - 1, FINAL, 0),
                "the stream's end marked elsewhere",
            ),
            (heads["record_tokens"] != size, "another record size"),
            (heads["first"] != records.astype(np.uint64) * np.uint64(size), "another offset"),
            (tokens != want, "another token count"),
            (starts > tokens, "more document starts than tokens"),
            (
                lengths != _length_of(tokens, starts, self._token_dtype),
                "a length its header does not account for",
            ),
        ]
        for bad, what in problems:
            if bad.any():
                self._damaged(records[np.argmax(bad)], what)
        self._damaged(records[0], "reserved header bytes set")

    # ---- the stream ---------------------------------------------------------------------

    @property
    def dtype(self) -> np.dtype[Any]:
        """The tokens' dtype (``uint16`` or ``uint32``)."""
        return self._token_dtype

    @property
    def num_tokens(self) -> int:
        """Tokens in the whole stream."""
        return self._num_tokens

    @property
    def record_tokens(self) -> int:
        """Tokens per record (the last record may hold fewer)."""
        return self._record_tokens

    def read_spans(self, starts: npt.ArrayLike, lengths: npt.ArrayLike) -> npt.NDArray[Any]:
        """Tokens ``starts[k]:starts[k] + lengths[k]`` of the stream for each k, end to end in
        one flat array, read in one call of the compiled core.

        >>> import tempfile, numpy as np
        >>> from chute import write_tokens
        >>> ds = write_tokens(tempfile.mkdtemp() + "/c", [np.arange(10)], dtype=np.uint16,
        ...                   record_tokens=3)
        >>> ds.read_spans([8, 1], [2, 4]).tolist()
        [8, 9, 1, 2, 3, 4]
        >>> ds.close()
        """
        lo, count = self.check_spans(starts, lengths)
        return read_token_spans([self], None, lo, count).tokens

    def read_spans_documents(
        self, starts: npt.ArrayLike, lengths: npt.ArrayLike
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """`read_spans`, the stream offsets where documents begin inside the spans (span
        by span, rising within each) and how many in each span, from the same call."""
        lo, count = self.check_spans(starts, lengths)
        read = read_token_spans([self], None, lo, count, documents=True)
        return read.tokens, read.starts, read.counts

    def check_spans(
        self, starts: npt.ArrayLike, lengths: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Span starts and lengths as int64 arrays, each span inside the stream."""
        lo, count = _offsets(starts, "span starts"), _offsets(lengths, "span lengths")
        if lo.shape != count.shape:
            raise ValueError(f"{lo.size} span starts but {count.size} lengths")
        end = self._num_tokens
        if lo.size and (
            int(lo.min()) < 0
            or int(count.min()) < 0
            or int(lo.max()) > end
            or int(count.max()) > end
            or int((lo + count).max()) > end  # both within the stream: no overflow
        ):
            raise RecordIndexError(
                f"a span outside the stream's {end} tokens (or of negative length)"
            )
        return lo, count

    def tokens(self, start: int, stop: int) -> npt.NDArray[Any]:
        """Tokens ``start:stop`` of the whole stream (a copy)."""
        a = check_int("start", start, minimum=0, maximum=self._num_tokens)
        b = check_int("stop", stop, minimum=a, maximum=self._num_tokens)
        return self.read_spans([a], [b - a])

    def document_starts(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """The stream offsets in ``start:stop`` where a document begins, rising (each record
        the span touches read and checked; no token copied)."""
        a = check_int("start", start, minimum=0, maximum=self._num_tokens)
        b = check_int("stop", stop, minimum=a, maximum=self._num_tokens)
        span = np.array([a], np.int64), np.array([b - a], np.int64)
        return read_token_spans([self], None, *span, documents=True, copy=False).starts

    def _place(self) -> tuple[InPlace, tuple[Any, Any]] | None:
        """The store as the compiled core reads it in place (where it can), and this
        dataset as a source of the token reader over it; made once per store snapshot."""
        view = None if self._in_place is None else self._in_place()
        if view is None:
            return None
        placed = self._placed
        if placed is None or placed[0] is not view:
            placed = self._placed = (view, (self._params, view.where))
        return placed

    def _gather_for(
        self, lo: npt.NDArray[np.int64], count: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """The records spans touch, gathered by the store (its retries, its errors)."""
        keep = count > 0
        first = lo[keep] // self._record_tokens
        pieces = (lo[keep] + count[keep] - 1) // self._record_tokens - first + 1
        records = np.unique(ranges(first, pieces))
        values, offsets = self._store.gather_packed(records)
        return values, offsets, records

    def _refuse(self, code: int, record: int) -> NoReturn:
        """The exception for what the token reader found wrong at ``record``."""
        if code == codes.TE_SPAN:
            raise RecordIndexError(f"a span outside the stream's {self._num_tokens} tokens")
        if code == codes.TE_STARTS:
            self._damaged(record, "document starts out of order or out of the record")
        if code == codes.TE_HEADER:
            values, offsets = self._store.gather_packed([record])
            if values.size < HEADER.itemsize:
                self._damaged(record, f"{values.size} bytes, no header")
            heads = values[: HEADER.itemsize].view(HEADER)
            self._explain(np.array([record], np.int64), heads, offsets[1:] - offsets[:-1])
        self._damaged(record, f"unreadable (token reader code {code})")

    # ---- documents ------------------------------------------------------------------------

    def _document_index(self) -> npt.NDArray[np.int64]:
        """Documents that begin before each record, and in all (``n_records + 1`` counts),
        from the record table alone: a record's length tells how many starts it holds."""
        with self._lock:
            if self._documents is None:
                n = self._records
                lengths = self._store.lengths(np.arange(n, dtype=np.int64)).astype(np.int64)
                tokens = np.full(n, self._record_tokens, np.int64)
                tokens[-1] = self._last_tokens
                starts, rest = np.divmod(
                    lengths - HEADER.itemsize - tokens * self._token_dtype.itemsize, _START.itemsize
                )
                bad = (rest != 0) | (starts < 0) | (starts > tokens)
                if bad.any():
                    self._damaged(np.argmax(bad), "a length its tokens do not account for")
                self._documents = np.concatenate([[0], np.cumsum(starts)]).astype(np.int64)
            return self._documents

    def __len__(self) -> int:
        """The number of documents."""
        return int(self._document_index()[-1])

    def document_span(self, i: int) -> tuple[int, int]:
        """Document ``i``'s ``(start, stop)`` in the stream."""
        if not isinstance(i, (int, np.integer)) or isinstance(i, (bool, np.bool_)):
            raise TypeError(
                f"a token dataset is indexed by document number, got {type(i).__name__}; "
                "ds.tokens(start, stop) reads any span of the stream"
            )
        i = int(i)
        index = self._document_index()
        n = int(index[-1])
        if not -n <= i < n:
            raise RecordIndexError(f"document {i} is out of range for {n} documents")
        i %= n
        start = self._nth_start(index, i)
        stop = self._num_tokens if i + 1 == n else self._nth_start(index, i + 1)
        return start, stop

    def _nth_start(self, index: npt.NDArray[np.int64], i: int) -> int:
        record = int(np.searchsorted(index, i, side="right")) - 1
        size = self._record_tokens
        every = self.document_starts(record * size, min((record + 1) * size, self._num_tokens))
        k = i - int(index[record])
        if k >= every.size:
            self._damaged(record, "fewer document starts than its length says")
        return int(every[k])

    def __getitem__(self, i: int) -> npt.NDArray[Any]:
        """Document ``i``'s tokens."""
        start, stop = self.document_span(i)
        return self.read_spans([start], [stop - start])

    def __repr__(self) -> str:
        return (
            f"TokenDataset({str(self._path)!r}, tokens={self._num_tokens}, dtype={self.dtype}, "
            f"record_tokens={self._record_tokens})"
        )


class TokenRead(NamedTuple):
    """What `read_token_spans` read: the spans' tokens end to end and, when asked, the
    stream offsets where documents begin inside each span and how many in each."""

    tokens: npt.NDArray[Any]
    starts: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]


def read_token_spans(
    datasets: list[TokenDataset],
    which: npt.NDArray[np.int32] | None,
    lo: npt.NDArray[np.int64],
    count: npt.NDArray[np.int64],
    *,
    documents: bool = False,
    copy: bool = True,
    held_only: bool = False,
) -> TokenRead:
    """Tokens ``lo[k]:lo[k] + count[k]`` of the stream of ``datasets[which[k]]`` (all of the
    first when ``which`` is None) for each k, in one call of the compiled core across the
    datasets (of one token dtype, the spans checked by `TokenDataset.check_spans`); with
    ``copy=False`` only the document starts (``tokens`` is then empty), from every record
    the spans touch, or with ``held_only`` from a local store's records whose length in the
    record table leaves room for starts (packing's read: a record passed over is read, and
    checked, with its tokens)."""
    tokens = np.empty(int(count.sum()) if copy else 0, datasets[0].dtype)
    counts = np.empty(lo.size, np.int64) if documents else None
    out = tokens if copy else None

    def read(sources: list[Any], threads: int) -> _Result:
        return read_tokens(sources, which, lo, count, out, counts, threads, held_only)

    def touched(s: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        mine = slice(None) if which is None else which == s
        return lo[mine], count[mine]

    result = native_read(
        datasets, read, touched, lambda span: 0 if which is None else int(which[span])
    )
    docs = result[4]
    if docs is None or counts is None:
        return TokenRead(tokens, np.empty(0, np.int64), np.zeros(lo.size, np.int64))
    return TokenRead(tokens, np.frombuffer(docs, np.int64), counts)


def positions_of(indices: Any) -> npt.NDArray[np.uint64]:
    """Window or sequence numbers as a flat, C-contiguous uint64 array, as the compiled
    core takes them: a negative one becomes one past every range. Booleans, floats and other
    non-integers are a TypeError, as they are for records (`as_indices`).

    >>> positions_of([[3], [-1]]).tolist()
    [3, 18446744073709551615]
    """
    flat = as_indices(indices).reshape(-1)
    if flat.dtype != np.uint64:
        flat = flat.astype(np.int64).view(np.uint64)
    return np.ascontiguousarray(flat)


def read_packed_rows(
    dataset: TokenDataset,
    tables: dict[int, bytes],
    sequences: npt.NDArray[np.uint64],
    group: int,
    seq_len: int,
) -> dict[str, npt.NDArray[Any]]:
    """Sequence ``q`` of ``sequences`` (`positions_of`) is row ``q % group`` of the packing
    ``tables[q // group]`` (made by `chute._native.pack_groups`); the rows as ``tokens``,
    ``segment_ids`` and ``positions`` of ``(n, seq_len)``, in one call of the compiled core
    (a key missing from ``tables`` is a KeyError, a negative sequence an IndexError)."""
    n = sequences.size
    batch = {
        "tokens": np.empty((n, seq_len), dataset.dtype),
        "segment_ids": np.empty((n, seq_len), np.int32),
        "positions": np.empty((n, seq_len), np.int32),
    }

    def read(sources: list[Any], threads: int) -> _Result:
        return read_packed(sources[0], tables, sequences, group, batch["tokens"],
                           batch["segment_ids"], batch["positions"], threads)  # fmt: skip

    def pieces(_: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The stream spans of the rows' pieces (to gather their records)."""
        starts, lengths = [], []
        for q in sequences.tolist():
            p = Packing.of(tables[q // group])
            b = q % group
            starts.append(p.starts[p.edges[b] : p.edges[b + 1]])
            lengths.append(p.lengths[p.edges[b] : p.edges[b + 1]])
        empty = [np.empty(0, np.int64)]
        return np.concatenate(starts + empty), np.concatenate(lengths + empty)

    native_read([dataset], read, pieces, lambda _: 0)
    return batch


class Packing(NamedTuple):
    """The pieces of a packed group: sequence ``b`` is the stream spans
    ``starts[edges[b]:edges[b + 1]]`` (each ``lengths[...]`` tokens long), in that order."""

    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    edges: npt.NDArray[np.int64]

    @classmethod
    def of(cls, packed: bytes) -> Packing:
        """The packing a table of `chute._native.pack_groups` describes: int64
        ``[bins, edges (bins + 1), piece starts, piece lengths]``."""
        table = np.frombuffer(packed, np.int64)
        bins = int(table[0])
        edges = table[1 : bins + 2]
        pieces = int(edges[-1])
        return cls(table[bins + 2 : bins + 2 + pieces], table[bins + 2 + pieces :], edges)


_Result = tuple[int, int, int, int, "bytearray | None", int]


def native_read(
    datasets: list[TokenDataset],
    read: Callable[[list[Any], int], _Result],
    touched: Callable[[int], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
    owner: Callable[[int], int],
    outside: Callable[[int], NoReturn] | None = None,
) -> _Result:
    """``read(sources, threads)`` with each dataset's records where they lie in a local store;
    gathered by their store first elsewhere (shards, object storage) or when that failed
    (the store's retry and its exception then): the records spans ``touched(s)`` (starts,
    lengths) of dataset s touch. A failure the token reader reports at span k is raised by
    dataset ``owner(k)``; a span outside its stream by ``outside(k)`` where given (the
    caller's mistake, not the store's: no second try)."""
    placed = [ds._place() for ds in datasets]
    if None not in placed:
        views = [p[0] for p in placed if p]
        result = read([p[1] for p in placed if p], max(v.threads for v in views))
        check_in_place(views)
        if not result[0]:
            return result
        if result[0] == codes.TE_SPAN and outside is not None:
            outside(result[1])
    gathered = [(ds._params, ds._gather_for(*touched(s))) for s, ds in enumerate(datasets)]
    result = read(gathered, 1)
    code, span, record = result[:3]
    if code == codes.TE_SPAN and outside is not None:
        outside(span)
    if code:
        datasets[owner(span)]._refuse(code, record)
    return result
