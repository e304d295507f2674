"""Errors that name what is wrong: the argument, the transform and variable, the file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from chute.insitu import InSituDataset, open_geometries, split_by_chunk


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "a.zarr"
    zarr.open_group(str(p), mode="w").create_array("t2m", shape=(16, 2), chunks=(8, 2), dtype="f4")[
        :
    ] = 1
    return p


def dataset(path: Path, **kw: object) -> InSituDataset:
    m = split_by_chunk(open_geometries(path)["t2m"], (1.0, 0.0, 0.0))
    return InSituDataset(path, m, batch_size=4, num_threads=1, **kw)  # type: ignore[arg-type]


def test_an_epoch_past_the_order_counter_names_epoch(path: Path) -> None:
    with dataset(path) as ds, pytest.raises(ValueError, match=r"^epoch must be"):
        ds.set_epoch(2**70)


def test_open_geometries_takes_one_name_as_a_string(path: Path) -> None:
    assert list(open_geometries(path, "t2m")) == ["t2m"]
    with pytest.raises(TypeError, match="a name or a list of names"):
        open_geometries(path, [1])  # type: ignore[list-item]


def test_a_chunk_transform_returning_none_is_named(path: Path) -> None:
    def forgot_return(variable: str, chunk: np.ndarray) -> None:
        chunk *= 2

    with (
        dataset(path, chunk_transforms=[forgot_return]) as ds,
        pytest.raises(TypeError, match=r"forgot_return.* returned NoneType for variable 't2m'"),
    ):
        list(ds.train)


def test_a_batch_transform_returning_none_is_named(path: Path) -> None:
    def forgot_return(batch: dict) -> None:  # type: ignore[type-arg]
        pass

    with (
        dataset(path, batch_transforms=[forgot_return]) as ds,
        pytest.raises(TypeError, match=r"batch transform .*forgot_return.* returned NoneType"),
    ):
        list(ds.train)


def test_a_damaged_metadata_document_is_named(path: Path) -> None:
    (path / "t2m" / "zarr.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"t2m/zarr.json is damaged"):
        open_geometries(path)


def test_closing_from_another_thread_gives_chutes_message(path: Path) -> None:
    """Not asyncio's bare 'Event loop is closed' (in a child: a hang fails)."""
    script = textwrap.dedent(f"""
        import sys, threading
        from chute.insitu import InSituDataset, open_geometries, split_by_chunk
        path = {str(path)!r}
        m = split_by_chunk(open_geometries(path)["t2m"], (1.0, 0.0, 0.0))
        ds = InSituDataset(path, m, batch_size=1, prefetch=4, num_threads=1)
        it = iter(ds.train)
        next(it)
        closer = threading.Thread(target=ds.close)
        closer.start(); closer.join()
        try:
            for _ in it:
                pass
        except RuntimeError as e:
            print(e)
            sys.exit(0 if str(e) == "the dataset was closed during this pass" else 3)
        sys.exit(4)
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()[-2000:]
