"""RecordSchema: the one reader and writer of schema.json, byte for byte what chute wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import chute
from chute.datasets import RecordSchema
from chute.errors import CorruptStoreError


@pytest.mark.parametrize("ragged", [False, True])
def test_schema_json_round_trips_byte_for_byte(tmp_path: Path, ragged: bool) -> None:
    path = tmp_path / "d"
    if ragged:
        chute.write_ragged(path, [np.zeros((2, 3), ">f8")], codec="raw").close()
    else:
        chute.write_dataset(path, np.zeros((4, 2, 3), ">f8"), codec="raw").close()
    raw = (path / "schema.json").read_bytes()
    schema = RecordSchema.read(path)
    assert schema == RecordSchema(
        dtype=np.dtype(">f8"), item_shape=(3,) if ragged else (2, 3), ragged=ragged, codec="raw"
    )
    assert schema.to_json() == raw
    schema.write(tmp_path)
    assert (tmp_path / "schema.json").read_bytes() == raw
    with chute.RaggedDataset(path) if ragged else chute.Dataset(path) as ds:
        assert ds.schema == schema and ds.codec == "raw"


def test_same_records_ignores_the_codec_only() -> None:
    a = RecordSchema(dtype=np.dtype("<i4"), item_shape=(3,))
    assert a.same_records(a.with_codec("raw")) and a.with_codec("raw") != a
    assert not a.same_records(RecordSchema(dtype=np.dtype(">i4"), item_shape=(3,)))
    assert not a.same_records(RecordSchema(dtype=np.dtype("<i4"), item_shape=(3,), ragged=True))


def test_a_bad_schema_document_names_where_it_is() -> None:
    with pytest.raises(CorruptStoreError, match="here: a negative dimension"):
        RecordSchema.from_fields({"dtype": "<i4", "shape": [-1]}, "here")
    with pytest.raises(CorruptStoreError, match="here does not describe a dataset"):
        RecordSchema.from_fields(["dtype"], "here")


@pytest.mark.parametrize("shape", [[4.5], ["4"], [True], 4, "4", [[2]]])
def test_a_shape_that_is_not_integers_is_damage_not_cut(shape: object) -> None:
    """4.5 would be read as 4 and "4" as a number: a record shape holds integers or the
    schema is damaged."""
    with pytest.raises(CorruptStoreError, match="here: the record shape must be integers"):
        RecordSchema.from_fields({"dtype": "<i4", "shape": shape}, "here")
    assert RecordSchema.from_fields(
        {"dtype": "<i4", "shape": [2, np.int64(3)]}, "x"
    ).item_shape == (
        2,
        3,
    )
