"""`BytesDataset`: bytes records exactly as written (empty ones and trailing NULs included),
from write_ragged, a bare store or a sharded dataset, locally and through s3://; a loader
stream with threads and worker processes."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import BytesDataset, DataLoader, ImageDataset, RecordStore
from chute.errors import (
    CorruptStoreError,
    RecordDecodeError,
    StoreKindError,
    StoreNotFoundError,
)
from tests.loader import maps

BLOBS = [bytes(range(i % 7)) + b"\x00" * (i % 3) for i in range(90)]  # some empty, NUL-ended


def test_bytes_read_back_exactly(tmp_path: Path, serve: Any) -> None:
    chute.write_ragged(tmp_path / "one", BLOBS).close()
    chute.write_ragged(tmp_path / "sharded", BLOBS, shard_records=20).close()
    for name in ("one", "sharded"):
        with serve.open(BytesDataset, tmp_path / name, verify=True) as ds:
            assert len(ds) == len(BLOBS) and ds[0] == b"" and ds[2] == b"\x00\x01\x00\x00"
            assert ds[np.arange(len(BLOBS))] == BLOBS
            assert ds[::-7] == BLOBS[::-7] and ds[[89, 3, 3]] == [BLOBS[89], BLOBS[3], BLOBS[3]]
            assert pickle.loads(pickle.dumps(ds))[5] == BLOBS[5]


def test_a_bare_store_is_read_as_bytes(tmp_path: Path, serve: Any) -> None:
    with RecordStore(tmp_path / "bare.zr", mode="w") as store:
        store.append(BLOBS)
    with serve.open(BytesDataset, tmp_path / "bare.zr") as ds:
        assert ds[np.arange(len(BLOBS))] == BLOBS


def test_other_records_are_refused_naming_their_kind(tmp_path: Path) -> None:
    chute.write_dataset(tmp_path / "fixed", np.arange(8)).close()
    chute.write_ragged(tmp_path / "ints", [np.arange(3, dtype=np.int32)]).close()
    with pytest.raises(StoreKindError, match="open it with Dataset"):
        BytesDataset(tmp_path / "fixed")
    with pytest.raises(StoreKindError, match=r"int32 records.*not bytes"):
        BytesDataset(tmp_path / "ints")
    with pytest.raises(StoreNotFoundError):
        BytesDataset(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError):
        BytesDataset(tmp_path / "empty")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bytes_stream_in_the_loader(tmp_path: Path, workers: int) -> None:
    chute.write_ragged(tmp_path / "b", BLOBS, shard_records=30).close()
    with BytesDataset(tmp_path / "b") as ds:
        with DataLoader({"blob": ds}, batch_size=16, sampler="sequential", seed=1) as dl:
            assert next(dl)["blob"] == BLOBS[:16]
        passed = [b["blob"] for b in chute.iterate({"blob": ds}, 16, workers=workers)]
        assert [blob for batch in passed for blob in batch] == BLOBS
        options = {"batch_size": 16, "seed": 1, "map": maps.decode_length}
        with DataLoader({"blob": ds}, **options, workers=workers) as dl:
            got = [next(dl) for _ in range(8)]
        with DataLoader({"blob": ds}, **options) as dl:
            want = [next(dl) for _ in range(8)]
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a["n"], b["n"]) and np.array_equal(a["sum"], b["sum"])
    assert got[0]["n"].dtype.kind == "i"  # numbers collate into arrays


def _png(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_images_decode_in_threads_and_workers(tmp_path: Path, serve: Any) -> None:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 255, (4 + i % 3, 5, 3), np.uint8) for i in range(40)]
    chute.write_ragged(tmp_path / "png", [_png(im) for im in images], shard_records=15).close()
    with serve.open(ImageDataset, tmp_path / "png") as ds:
        got = ds[[39, 0, 7]]
        assert all(np.array_equal(g, images[i]) for g, i in zip(got, [39, 0, 7], strict=True))
        assert np.array_equal(pickle.loads(pickle.dumps(ds))[5], images[5])
    with ImageDataset(tmp_path / "png") as ds:
        for workers in (0, 2):
            with DataLoader({"img": ds}, batch_size=8, sampler="sequential", seed=0,
                            workers=workers) as dl:  # fmt: skip
                batch = next(dl)["img"]
            assert all(np.array_equal(a, b) for a, b in zip(batch, images[:8], strict=True))


def _encoded(image: Any, fmt: str = "PNG", **options: Any) -> bytes:
    import io

    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def test_each_image_mode_decodes_to_its_documented_dtype_and_shape(tmp_path: Path) -> None:
    from PIL import Image

    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (6, 7, 3), np.uint8))
    clear = rgb.convert("P")
    clear.info["transparency"] = 0
    cases = {
        "L": (rgb.convert("L"), "|u1", (6, 7)),
        "LA": (rgb.convert("LA"), "|u1", (6, 7, 2)),
        "RGBA": (rgb.convert("RGBA"), "|u1", (6, 7, 4)),
        "P": (rgb.convert("P"), "|u1", (6, 7, 3)),
        "P+transparency": (clear, "|u1", (6, 7, 4)),
        "1": (rgb.convert("1"), "|b1", (6, 7)),
        "I;16": (
            Image.fromarray(np.arange(42, dtype=np.uint16).reshape(6, 7) * 999),
            "<u2",
            (6, 7),
        ),
    }
    records = [_encoded(image) for image, _, _ in cases.values()]
    records.append(_encoded(Image.fromarray(np.full((2, 3), 0.5, np.float32)), "TIFF"))
    records.append(_encoded(Image.fromarray(np.arange(6, dtype=np.int32).reshape(2, 3)), "TIFF"))
    want = [(dtype, shape) for _, dtype, shape in cases.values()]
    want += [("<f4", (2, 3)), ("<i4", (2, 3))]
    chute.write_ragged(tmp_path / "modes", records).close()
    with ImageDataset(tmp_path / "modes") as ds:
        got = ds[list(range(len(records)))]
    assert [(a.dtype.str, a.shape) for a in got] == want
    palette = got[list(cases).index("P")]
    assert np.array_equal(palette, np.asarray(rgb.convert("P").convert("RGB")))  # pixels


def test_a_record_that_is_no_image_is_a_decode_error_naming_it(tmp_path: Path) -> None:
    from PIL import Image

    jpeg = _encoded(Image.fromarray(np.zeros((20, 30, 3), np.uint8)), "JPEG")
    records = [_png(np.zeros((2, 2), np.uint8)), b"not a picture", jpeg[: len(jpeg) // 2], b""]
    chute.write_ragged(tmp_path / "bad", records, shard_records=2).close()
    reasons = {1: "13 bytes in no format Pillow recognises", 2: "[Tt]runcated", 3: "empty"}
    with ImageDataset(tmp_path / "bad") as ds:
        for index, reason in reasons.items():
            for key in (index, index - len(records), [0, index]):
                with pytest.raises(RecordDecodeError, match=f"record {index} .*{reason}") as info:
                    ds[key]
                assert info.value.index == index
                assert isinstance(info.value, ValueError)
                assert not isinstance(info.value, CorruptStoreError)  # the store is fine
        for workers in (0, 1):
            with (
                DataLoader({"img": ds}, batch_size=2, sampler="sequential", workers=workers) as dl,
                pytest.raises(RecordDecodeError, match="record 1 ") as info,
            ):
                next(dl)
            assert info.value.index == 1
