"""`write_tokens`: documents of tokens cut into the token records of `chute.TokenDataset`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.checks import check_int
from chute.datasets._tokens import FINAL, HEADER, MAGIC, TOKEN_DTYPES, VERSION, TokenDataset
from chute.datasets._tokens import max_record_tokens as _most
from chute.datasets._writers import write_ragged

__all__ = ["DEFAULT_RECORD_TOKENS", "write_tokens"]

DEFAULT_RECORD_TOKENS = 2048
"""Tokens per record unless told: a window of a thousand tokens reads one or two records of
4 KiB (uint16), and a billion tokens make half a million records."""
_CODES = {dtype: code for code, dtype in TOKEN_DTYPES.items()}


def _token_dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    want = np.dtype(dtype).newbyteorder("<")
    if want not in _CODES:
        raise TypeError(f"tokens are stored as uint16 or uint32, not {np.dtype(dtype)}")
    return want


def _document(doc: Any, number: int, dtype: np.dtype[Any] | None) -> npt.NDArray[Any]:
    """Document ``number`` as a 1-D integer array in ``dtype`` (its own, when None), its
    values checked to fit."""
    if isinstance(doc, (bytes, bytearray, memoryview)):
        array = np.frombuffer(doc, np.uint8)
    else:
        array = np.asarray(doc)
    if array.size == 0:
        raise ValueError(
            f"document {number} is empty; a token dataset keeps documents of at least one "
            "token (drop empty ones before writing, so document numbers stay meaningful)"
        )
    if array.ndim != 1 or array.dtype.kind not in "ui":
        raise TypeError(
            f"document {number} is a {array.dtype} array of shape {array.shape}; a document "
            "is a 1-D array (or list, or bytes) of integer tokens"
        )
    if dtype is None:
        return array
    if array.dtype != dtype:
        low, high = int(array.min()), int(array.max())
        info = np.iinfo(dtype)
        if low < 0 or high > info.max:
            bad = low if low < 0 else high
            raise ValueError(f"document {number} holds token {bad}, outside {dtype}'s range")
        array = array.astype(dtype)
    return array


class _Cutter:
    """Documents in, token records out: ``size`` tokens each, the last one shorter."""

    def __init__(self, size: int, dtype: np.dtype[Any]) -> None:
        self.size = size
        self.dtype = dtype
        self.buffer = np.empty(size, dtype)
        self.fill = 0
        self.starts: list[int] = []
        self.records = 0

    def add(self, doc: npt.NDArray[Any]) -> Iterator[npt.NDArray[np.uint8]]:
        if self.fill == self.size:
            yield self.cut()
        self.starts.append(self.fill)
        at = 0
        while at < doc.size:
            take = min(self.size - self.fill, doc.size - at)
            self.buffer[self.fill : self.fill + take] = doc[at : at + take]
            self.fill += take
            at += take
            if self.fill == self.size and at < doc.size:
                yield self.cut()

    def cut(self, final: bool = False) -> npt.NDArray[np.uint8]:
        head = np.zeros(1, HEADER)
        head["flags"] = FINAL if final else 0
        head["magic"] = MAGIC
        head["version"] = VERSION
        head["dtype"] = _CODES[self.dtype]
        head["record_tokens"] = self.size
        head["tokens"] = self.fill
        head["starts"] = len(self.starts)
        head["first"] = self.records * self.size
        starts = np.array(self.starts, "<u4")
        record = np.concatenate(
            [head.view(np.uint8), self.buffer[: self.fill].view(np.uint8), starts.view(np.uint8)]
        )
        self.fill = 0
        self.starts = []
        self.records += 1
        return record


def _records(
    documents: Iterable[Any], dtype: np.dtype[Any] | None, size: int | None
) -> Iterator[npt.NDArray[np.uint8]]:
    docs = iter(documents)
    first = next(docs, None)
    if first is None:
        raise ValueError("no documents to write: a token dataset holds at least one")
    if dtype is None:
        own = _document(first, 0, None).dtype.newbyteorder("<")
        if own.kind == "u" and own.itemsize == 1:  # bytes: byte-level tokens
            own = np.dtype("<u2")
        elif own not in _CODES:
            raise TypeError(
                f"the first document is {own}; pass dtype=np.uint16 (a vocabulary of "
                "up to 65536) or np.uint32, and every token is checked to fit"
            )
        dtype = own
    kind: np.dtype[Any] = dtype
    head = _document(first, 0, kind)
    if size is None:
        size = DEFAULT_RECORD_TOKENS
    elif size > _most(kind):
        raise ValueError(
            f"record_tokens={size} is over {_most(kind)}, the most {kind} tokens a record holds "
            "with their document starts within the 1 MiB record cap"
        )
    cutter = _Cutter(size, kind)
    yield from cutter.add(head)
    for number, doc in enumerate(docs, start=1):
        yield from cutter.add(_document(doc, number, kind))
    yield cutter.cut(final=True)


def write_tokens(
    path: str | os.PathLike[str],
    documents: Iterable[Any],
    *,
    dtype: npt.DTypeLike | None = None,
    record_tokens: int | None = None,
    codec: str | None = None,
    level: int | None = None,
    overwrite: bool = False,
    shard_records: int | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    break_lock: bool = False,
    **store_options: Any,
) -> TokenDataset:
    """Write an iterable of documents (1-D integer arrays, lists or ``bytes`` of tokens) as
    one token stream and return it opened (`chute.TokenDataset`).

    ``dtype`` is ``uint16`` or ``uint32`` (default: the first document's, which must be
    one of them, or ``uint16`` for ``bytes``); every token is checked to fit. The stream
    is cut into records of ``record_tokens`` tokens (default 2048; at most what fits the
    1 MiB record cap), so a document of any length is kept whole, its edges recorded;
    documents are consumed one at a time, never held together. An empty document is
    refused (its number would be lost).

    ``codec`` is ``"raw"`` unless told: the ids of a trained tokenizer are already a
    compressed text, which zstd shrinks little, while decoding it would cost every window
    (``"zstd"`` pays off for byte-level or small vocabularies, and for object storage).
    The rest is as in `chute.write_ragged`: ``level``, ``overwrite``,
    ``shard_records=N`` (a sharded dataset of N records each; ``workers`` shards at once),
    a URL (``s3://`` ...) as ``path`` with ``store_options`` and ``break_lock``. A write that
    fails part way (a token out of range, say) leaves nothing behind. A token dataset is
    written whole: it is not appended to, as its records must stay ``record_tokens`` long.

    >>> import tempfile, numpy as np
    >>> ds = write_tokens(tempfile.mkdtemp() + "/c", [b"hello", b"world"], dtype=np.uint16)
    >>> len(ds), ds.num_tokens, bytes(ds[1].astype(np.uint8))
    (2, 10, b'world')
    >>> ds.close()
    """
    kind = None if dtype is None else _token_dtype(dtype)
    size = None if record_tokens is None else check_int("record_tokens", record_tokens, minimum=1)
    written = write_ragged(
        path, _records(documents, kind, size), dtype=np.uint8, item_shape=(),
        codec="raw" if codec is None else codec,
        level=level, mode="w", overwrite=overwrite, shard_records=shard_records,
        workers=workers, progress=progress, break_lock=break_lock, **store_options,
    )  # fmt: skip
    written.close()
    return TokenDataset(path, **store_options)
