"""The compiled core's copy of the format's constants agrees with store/_format.py."""

from __future__ import annotations

import types

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
