"""The compiled core's copy of the format's constants agrees with store/_format.py."""

from __future__ import annotations

import types

import numpy as np
import pytest

from chute._native import codes
from chute.store import _format as fmt


def test_the_built_core_agrees_with_the_format() -> None:
    fmt.check_native(codes)  # also run at import; here it is named
    assert codes.MAX_RECORD == fmt.MAX_RECORD
    assert list(fmt.Codec) == [codes.CODEC_RAW, codes.CODEC_ZSTD, codes.CODEC_ZSTD_DICT]


@pytest.mark.parametrize(
    "name", ["MAX_RECORD", "CODEC_RAW", "CODEC_ZSTD", "CODEC_ZSTD_DICT", "LOC_SIZE", "SUM_SIZE"]
)
def test_a_drifted_constant_refuses_the_core(name: str) -> None:
    drifted = types.SimpleNamespace(**{n: getattr(codes, n) for n in dir(codes)})
    setattr(drifted, name, getattr(codes, name) + 1)
    with pytest.raises(ImportError, match=f"{name}: compiled"):
        fmt.check_native(drifted)


def test_put_entry_writes_one_whole_entry_and_checks_its_buffer() -> None:
    from chute import _native

    target = np.zeros(64, np.uint8)  # numpy aligns its data to 16 bytes or more
    _native.put_entry(target, 16, bytes(range(16)))
    assert target[16:32].tobytes() == bytes(range(16))
    assert not target[:16].any() and not target[32:].any()
    for bad, why in [
        ((target, 16, b"short"), "16 bytes"),
        ((target, 56, bytes(16)), "past the end"),
        ((target, 2**63, bytes(16)), "past the end"),
    ]:
        with pytest.raises(ValueError, match=why):
            _native.put_entry(*bad)
    with pytest.raises(BufferError, match="not writable"):
        _native.put_entry(bytes(64), 16, bytes(16))
    with pytest.raises(ValueError, match="aligned"):
        _native.put_entry(target, 8, bytes(16))


def _crc32c_reference(data: bytes) -> int:
    """CRC-32C a byte at a time from its definition (reflected polynomial 0x82F63B78)."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize(
    "n", [0, 1, 9, 65536, 3 * 65536 - 1, 3 * 65536, 3 * 65536 + 13, 6 * 65536 + 5]
)
def test_crc32c_across_the_three_lane_spans(n: int) -> None:
    """Buffers of three 64 KiB spans and more take the three-lane loop, joined by the GF(2)
    shift; the sum is the definition's, also chained from any split point."""
    from chute import _native

    assert _native.crc32c(b"123456789") == 0xE3069283  # the standard check value
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    want = _crc32c_reference(data)
    assert _native.crc32c(data) == want
    k = n // 3
    assert _native.crc32c(data[k:], _native.crc32c(data[:k])) == want
