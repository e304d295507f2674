"""The compiled core over chunks held as Python buffers (what a remote read decodes from):
the records decode as from mapped files, and no limit, table or buffer can make it read
outside a buffer. Every hostile case runs in a forked child, so a stray read that crashes
fails the test instead of the run."""

from __future__ import annotations

import gc
import zlib

import numpy as np
import pytest

from chute import _native
from chute._native import codes
from chute.store import _format as fmt
from tests.store.isolate import OK, WRONG_DATA, run_isolated


def _table(entries: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """Table entries (offset, phys, logic, chunk, codec)."""
    table = np.zeros(len(entries), fmt.LOC_DTYPE)
    for i, (offset, phys, logic, chunk, codec) in enumerate(entries):
        table[i] = (offset, phys, logic, chunk, codec, 0)
    return table


def _gather(table: np.ndarray, limits: list[int], chunks: object, n: int, size: int) -> tuple:
    out = np.zeros((n, size), np.uint8)
    result = _native.gather(
        table, np.array(limits, np.uint64), chunks, np.arange(n, dtype=np.int64), out, size,
        None, None, None, False, 1,
    )  # fmt: skip
    return result, out


def test_records_decode_from_buffers_of_every_kind() -> None:
    raw = bytes(range(8)) * 4
    packed = np.frombuffer(b"..abcdefgh", np.uint8)  # a numpy array, the record at byte 2
    chunks = _native.chunks_from_buffers([raw, packed, bytearray(b"zz12345678")])
    table = _table([(8, 8, 8, 0, 0), (2, 8, 8, 1, 0), (2, 8, 8, 2, 0)])
    (code, _, _, _), out = _gather(table, [32, 10, 10], chunks, 3, 8)
    assert code == 0
    assert [bytes(r) for r in out] == [raw[8:16], b"abcdefgh", b"12345678"]


def test_a_record_past_its_chunks_limit_is_a_bounds_error() -> None:
    chunks = _native.chunks_from_buffers([bytes(16)])
    (code, pos, detail, _), _ = _gather(_table([(12, 8, 8, 0, 0)]), [16], chunks, 1, 8)
    assert (code, pos, detail) == (codes.GE_BOUNDS, 0, 20)


@pytest.mark.parametrize("limit", [17, 1 << 32, 2**64 - 1])
def test_a_limit_past_a_buffer_is_refused_before_any_read(limit: int) -> None:
    def check() -> int:
        data = bytes(16)
        chunks = _native.chunks_from_buffers([data])
        # the table asks for bytes past the buffer, inside the (false) limit
        table = _table([(limit - 8 if limit < 1 << 32 else 4096, 8, 8, 0, 0)])
        try:
            _gather(table, [limit], chunks, 1, 8)
        except ValueError as e:
            return OK if "past its end (16 bytes)" in str(e) else WRONG_DATA
        return WRONG_DATA

    assert run_isolated(check) == OK


def test_mapped_chunks_keep_their_span(tmp_path: object) -> None:
    import os

    path = os.path.join(str(tmp_path), "0.zr")
    with open(path, "wb") as f:
        f.write(b"x" * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = _native.map_chunks([fd])
        (code, _, _, _), out = _gather(_table([(8, 8, 8, 0, 0)]), [64], chunks, 1, 8)
        assert code == 0 and bytes(out[0]) == b"x" * 8
        with pytest.raises(ValueError, match="past its end"):
            _gather(_table([(8, 8, 8, 0, 0)]), [(1 << 32) + 1], chunks, 1, 8)
    finally:
        del chunks
        gc.collect()
        os.close(fd)


def test_hostile_buffers_are_refused() -> None:
    def check() -> int:
        strided = np.arange(64, dtype=np.uint8)[::2]
        objects = np.array([object()] * 4)
        cases: list[tuple[object, type[Exception], str]] = [
            (strided, ValueError, "not a C-contiguous buffer"),
            (objects, TypeError, "holds Python objects"),
            (3, TypeError, ""),
            ("text", TypeError, ""),
        ]
        for bad, error, words in cases:
            try:
                _native.chunks_from_buffers([b"fine", bad])
            except error as e:
                if words not in str(e):
                    return WRONG_DATA
            else:
                return WRONG_DATA
        try:
            _native.chunks_from_buffers(5)  # not a sequence
        except TypeError:
            pass
        else:
            return WRONG_DATA
        try:
            _native.gather(
                _table([]), np.zeros(0, np.uint64), object(), np.zeros(0, np.int64),
                np.zeros(1, np.uint8), 1, None, None, None, False, 1,
            )  # fmt: skip
        except (TypeError, ValueError):
            return OK
        return WRONG_DATA

    assert run_isolated(check) == OK


def test_a_held_buffer_cannot_move_under_a_gather() -> None:
    def check() -> int:
        data = bytearray(b"0123456789abcdef")
        chunks = _native.chunks_from_buffers([data])
        try:
            data.extend(b"x" * (1 << 20))  # would move the memory the capsule points at
        except BufferError:
            pass
        else:
            return WRONG_DATA
        (code, _, _, _), out = _gather(_table([(8, 8, 8, 0, 0)]), [16], chunks, 1, 8)
        if code or bytes(out[0]) != b"89abcdef":
            return WRONG_DATA
        del chunks
        gc.collect()
        data.extend(b"x")  # released with the capsule
        return OK

    assert run_isolated(check) == OK


def test_checksums_are_checked_over_buffers() -> None:
    record = b"payload!"
    chunks = _native.chunks_from_buffers([record])
    table = _table([(0, 8, 8, 0, 0)])
    sums = np.zeros(1, fmt.SUMS_DTYPE)
    sums[0] = (_native.crc32c(record), 0, 8, 0, 0, 1)
    out = np.zeros((1, 8), np.uint8)
    args = (table, np.array([8], np.uint64), chunks, np.zeros(1, np.int64), out, 8, None, None)
    assert _native.gather(*args, sums, True, 1)[0] == 0
    sums[0]["crc"] ^= 1
    assert _native.gather(*args, sums, True, 1)[0] == codes.GE_CHECKSUM
    assert zlib.crc32(bytes(out[0])) == zlib.crc32(record)
