"""One rule for a local archive's files on every read path (the direct readv of full zstd
chunks, and zarr's codec pipeline for edge chunks, gzip and sharded arrays): a regular
file inside the store, or a link to one; anything else is a `BadChunkError`, and only a
file that is truly absent reads as the fill value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import GzipCodec

from chute.errors import UnsafeFileError
from chute.insitu import InSituDataset, open_geometries, split_by_chunk

CODECS = ("zstd", "gzip", "shard")
KINDS = ("fifo", "dev-zero", "folder", "link-out", "link-to-nothing")


def make(root: Path, codec: str) -> Path:
    kw: dict[str, object] = {
        "zstd": {"chunks": (8, 4)},
        "gzip": {"chunks": (8, 4), "compressors": GzipCodec()},
        "shard": {"shards": (8, 4), "chunks": (4, 2)},
    }[codec]
    a = zarr.open_group(str(root), mode="w").create_array(
        "x", shape=(20, 4), dtype="f4", fill_value=-7.0, **kw
    )
    a[:] = np.arange(80, dtype="f4").reshape(20, 4) + 1
    return root


def damage(path: Path, kind: str, elsewhere: Path) -> None:
    elsewhere.write_bytes(path.read_bytes())  # read, it would pass for this chunk
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "link-out":
        path.symlink_to(elsewhere)
    else:
        path.symlink_to(path.parent / "gone")


def test_damaged_chunk_files_are_bad_chunks_on_every_read_path(tmp_path: Path) -> None:
    """A FIFO hung zarr's reads forever; /dev/zero or a folder in place of a shard read as
    the fill value; links out of the store were followed. Each is now a `BadChunkError`
    naming its key, full or edge chunk, whatever the codec (in a child: a hang fails)."""
    cases = []
    for codec in CODECS:
        for kind in KINDS:
            for key in ("x/c/0/0", "x/c/2/0"):  # a full chunk (samples 0-7), the edge (16-19)
                root = make(tmp_path / f"{codec}-{kind}-{key[4]}.zarr", codec)
                damage(root / key, kind, tmp_path / f"out-{codec}-{kind}-{key[4]}")
                cases.append((str(root), key))
    script = textwrap.dedent(f"""
        from chute.errors import BadChunkError
        from chute.insitu import InSituDataset, open_geometries, split_by_chunk
        wrong = []
        for root, key in {cases!r}:
            g = open_geometries(root)
            m = split_by_chunk(g["x"], (1.0, 0.0, 0.0))
            with InSituDataset(root, m, g, batch_size=20, num_threads=1) as ds:
                try:
                    list(ds.all)
                    wrong.append((root, "no error"))
                except BadChunkError as e:
                    if e.key != key:
                        wrong.append((root, str(e)))
        print(wrong)
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=240, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == "[]"


@pytest.mark.filterwarnings("ignore:Object at objects is not recognized")
@pytest.mark.parametrize("codec", CODECS)
def test_links_inside_the_store_are_followed_on_every_path(tmp_path: Path, codec: str) -> None:
    """Chunk files that are links to regular files inside the store (``cp -rs`` within it,
    deduplicated chunks) read as those files, full and edge chunks alike."""
    root = make(tmp_path / "a.zarr", codec)
    objects = root / "objects"
    objects.mkdir()
    for key in ("x/c/0/0", "x/c/2/0"):
        target = objects / key.replace("/", "_")
        (root / key).rename(target)
        (root / key).symlink_to(os.path.relpath(target, (root / key).parent))
    g = open_geometries(root)
    with InSituDataset(root, split_by_chunk(g["x"], (1.0, 0.0, 0.0)), g, batch_size=20) as ds:
        b = next(iter(ds.all))
    np.testing.assert_array_equal(b["x"], np.arange(80, dtype="f4").reshape(20, 4) + 1)


@pytest.mark.parametrize("codec", CODECS)
def test_only_an_absent_chunk_reads_as_the_fill_value(tmp_path: Path, codec: str) -> None:
    root = make(tmp_path / "a.zarr", codec)
    (root / "x" / "c" / "0" / "0").unlink()
    g = open_geometries(root)
    with InSituDataset(root, split_by_chunk(g["x"], (1.0, 0.0, 0.0)), g, batch_size=20) as ds:
        b = next(iter(ds.all))
    assert (b["x"][:8] == -7).all() and (b["x"][8:] > 0).all()


def test_a_metadata_document_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    """Metadata goes through the same rule: a FIFO ``zarr.json`` is refused, not waited on
    (in a child: a hang fails)."""
    root = make(tmp_path / "a.zarr", "zstd")
    doc = root / "x" / "zarr.json"
    doc.unlink()
    os.mkfifo(doc)
    script = textwrap.dedent(f"""
        import sys
        from chute.errors import UnsafeFileError
        from chute.insitu import open_geometries
        try:
            open_geometries({str(root)!r})
        except UnsafeFileError as e:
            sys.exit(0 if "zarr.json" in str(e) else 3)
        sys.exit(4)
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_a_metadata_link_out_of_the_store_is_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "a.zarr", "zstd")
    doc = root / "x" / "zarr.json"
    (tmp_path / "elsewhere.json").write_text(json.dumps(json.loads(doc.read_text())))
    doc.unlink()
    doc.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UnsafeFileError, match="outside"):
        open_geometries(root)
