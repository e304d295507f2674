"""Ray Data: convert images + labels + a ragged column through a local Ray, read it back with
chute and with Ray, compare every record; a task that fails once and is retried leaves no
duplicate or half shard behind."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own

import chute  # noqa: E402
import chute.ray  # noqa: E402
from chute.datasets import ShardedStore, read_manifest  # noqa: E402

N = 300
RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 255, (N, 8, 8, 3), dtype=np.uint8)
LABELS = RNG.integers(0, 10, N).astype(np.int64)
TOKENS = [RNG.integers(0, 1000, int(RNG.integers(1, 20))).astype(np.int32) for _ in range(N)]


def _source(blocks: int = 6) -> Any:
    rows = [
        {"image": IMAGES[i], "label": LABELS[i], "tokens": TOKENS[i], "index": i} for i in range(N)
    ]
    return ray.data.from_items(rows, override_num_blocks=blocks)


def _check_chute(path: Path) -> None:
    cols = chute.ray.open_columns(path)
    assert set(cols) == {"image", "label", "tokens", "index"}
    image, label, tokens = cols["image"], cols["label"], cols["tokens"]
    assert isinstance(image, chute.Dataset) and isinstance(tokens, chute.RaggedDataset)
    assert len(image) == len(label) == len(tokens) == N
    assert np.array_equal(image[:], IMAGES) and np.array_equal(label[:], LABELS)
    assert np.array_equal(cols["index"][:], np.arange(N))
    values, splits = tokens[:]
    for i in range(N):
        assert np.array_equal(values[splits[i] : splits[i + 1]], TOKENS[i])
    assert isinstance(image.store, ShardedStore)


def test_convert_and_read_back_through_chute_and_ray(local_ray: None, tmp_path: Path) -> None:
    out = tmp_path / "conv"
    opened = chute.ray.write_dataset(_source(), out, rows_per_shard=40)
    assert set(opened) == {"image", "label", "tokens", "index"}
    _check_chute(out)
    shards = read_manifest(out / "image").shards
    assert sum(n for _, n in shards) == N and all(n <= 40 for _, n in shards)
    assert not (out / ".staging").exists()
    # the same through Ray, in dataset order, every record
    rds = chute.ray.read_dataset(out, override_num_blocks=5)
    assert rds.count() == N
    rows = rds.take_all()
    assert [int(r["index"]) for r in rows] == list(range(N))
    for i, row in enumerate(rows):
        assert np.array_equal(row["image"], IMAGES[i]) and int(row["label"]) == LABELS[i]
        assert np.array_equal(row["tokens"], TOKENS[i])
    batches = list(chute.ray.read_dataset(out, ["label"]).iter_batches(batch_size=64))
    assert np.array_equal(np.concatenate([b["label"] for b in batches]), LABELS)
    assert set(batches[0]) == {"label"}
    # a small dataset: by default one read task a CPU of the local Ray (2), not ~200 blocks
    fitted = chute.ray.read_dataset(out).materialize()
    assert fitted.num_blocks() == 2
    assert [int(r["index"]) for r in fitted.take_all()] == list(range(N))


def test_read_tasks_are_one_a_block_and_at_least_one_a_cpu(tmp_path: Path) -> None:
    from chute.ray._source import BLOCK_BYTES, ChuteDatasource

    source = ChuteDatasource.__new__(ChuteDatasource)  # sized by hand: no files needed
    source.records, source.row_bytes = 20_000, 12_288  # 234 MiB: four 64 MiB blocks
    assert BLOCK_BYTES == 64 << 20
    assert [source.fitting_tasks(c) for c in (1, 2, 4, 8)] == [4, 4, 4, 8]
    source.records = 3
    assert source.fitting_tasks(8) == 3 and source.fitting_tasks(1) == 1


def test_a_retried_task_leaves_no_duplicate_or_half_shard(local_ray: None, tmp_path: Path) -> None:
    from chute.ray._sink import ChuteDatasink

    flag = tmp_path / "failed-once"

    class FlakySink(ChuteDatasink):
        """Dies once, in the task holding record 150, after that task wrote two shards."""

        def write(self, blocks: Any, ctx: Any) -> dict[str, Any]:
            def stream() -> Iterator[Any]:
                seen = []
                for block in blocks:
                    seen += block["index"].to_pylist()
                    yield block
                if 150 in seen and not flag.exists():
                    flag.touch()
                    raise RuntimeError("injected failure")

            return super().write(stream(), ctx)

    ds = _source(blocks=6)  # 50 rows a block and a write task: two shards of 20, then 10
    ctx = ds.context
    ctx.retried_map_errors, ctx.max_map_retries = True, 2
    out = tmp_path / "conv"
    out.mkdir()
    ds.write_datasink(FlakySink(out, None, "zstd", 20, frozenset()))
    assert flag.exists()  # the failure did happen, and the write still finished
    _check_chute(out)
    names = sorted(p.name for p in (out / "tokens").iterdir() if p.name.startswith("part-"))
    assert names == [name for name, _ in read_manifest(out / "tokens").shards]
    assert not (out / ".staging").exists()


def test_bad_conversions(local_ray: None, tmp_path: Path) -> None:
    chute.ray.write_dataset(_source(2), tmp_path / "a", columns=["label"], rows_per_shard=100)
    assert set(chute.ray.open_columns(tmp_path / "a")) == {"label"}
    with pytest.raises(FileExistsError):
        chute.ray.write_dataset(_source(2), tmp_path / "a")
    again = chute.ray.write_dataset(_source(2), tmp_path / "a", overwrite=True, ragged=["image"])
    assert isinstance(again["image"], chute.RaggedDataset)
    values, splits = again["image"][[3]]
    assert np.array_equal(values, IMAGES[3]) and splits.tolist() == [0, 8]
    with pytest.raises(KeyError, match="no columns"):
        chute.ray.open_columns(tmp_path / "a", ["nope"])
    with pytest.raises(chute.IncompleteDatasetError):
        (tmp_path / "a" / "columns.json").unlink()
        chute.ray.open_columns(tmp_path / "a")


def test_a_ragged_column_whose_blocks_come_as_arrays_of_different_widths(
    local_ray: None, tmp_path: Path
) -> None:
    # Ray's own blocking: a block of equal-length rows reaches the sink as one 2-D array,
    # so blocks of a ragged column can be fixed-shape arrays of different widths.
    rows = [{"tokens": np.arange(i // 10 + 1, dtype=np.int64)} for i in range(100)]
    written = chute.ray.write_dataset(
        ray.data.from_items(rows), tmp_path / "r", ragged=["tokens"], rows_per_shard=30
    )
    values, splits = written["tokens"][:]
    assert len(splits) == 101
    for i in range(100):
        assert np.array_equal(values[splits[i] : splits[i + 1]], rows[i]["tokens"])
    with pytest.raises(TypeError, match="ragged="):  # not named ragged: said so, not a numpy error
        chute.ray.write_dataset(ray.data.from_items(rows), tmp_path / "f", rows_per_shard=30)


def test_a_column_whose_type_changes_across_blocks_is_refused_whatever_the_grouping(
    local_ray: None, tmp_path: Path
) -> None:
    # 2**53 + 1 has no float64: joined with numpy's promotion it would come back as 2**53
    big = 2**53 + 1
    pairs = {"float64": 0.5, "uint64": np.uint64(2**63 + 5)}
    for other, value in pairs.items():
        items = [{"x": big}] * 20 + [{"x": value}] * 20
        for rows_per_shard in (40, 20):  # both blocks in one write task, or one each
            out = tmp_path / f"{other}-{rows_per_shard}"
            ds = ray.data.from_items(items, override_num_blocks=2)
            with pytest.raises(chute.ray.ColumnTypeError) as caught:
                chute.ray.write_dataset(ds, out, rows_per_shard=rows_per_shard)
            assert "column 'x'" in str(caught.value), caught.value
            assert "int64" in str(caught.value) and other in str(caught.value), caught.value
            assert not (out / "columns.json").exists() and not (out / "x").exists()
    same = [{"x": big}] * 40  # one type in every block: every value back exactly
    written = chute.ray.write_dataset(ray.data.from_items(same), tmp_path / "ok", rows_per_shard=15)
    assert written["x"][:].tolist() == [big] * 40


@pytest.mark.parametrize("blocks", [1, 3])
def test_a_string_column_is_refused_saying_so(local_ray: None, tmp_path: Path, blocks: int) -> None:
    """Not a dtype-across-blocks or shape message: strings are not supported, said so."""
    items = [{"s": "a", "n": 1}, {"s": "bbbb", "n": 2}, {"s": "", "n": 3}]
    for rows in (items, [{"s": np.array(["x"] * (i + 1)), "n": i} for i in range(3)]):
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        with pytest.raises(chute.ray.ColumnTypeError, match="string columns are not supported"):
            chute.ray.write_dataset(tmp_path / f"s{blocks}", ds, shard_records=1)
    only = ray.data.from_items(items, override_num_blocks=blocks)
    kept = chute.ray.write_dataset(tmp_path / f"n{blocks}", only, columns=["n"], shard_records=1)
    assert kept["n"][:].tolist() == [1, 2, 3]


def test_a_second_conversion_into_one_folder_is_refused_and_the_first_completes(
    local_ray: None, tmp_path: Path
) -> None:
    out, go = tmp_path / "conv", tmp_path / "go"

    def hold(batch: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + 60  # never hangs the suite, whatever happens
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return batch

    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            slow = _source(2).map_batches(hold)
            outcome["columns"] = chute.ray.write_dataset(slow, out, rows_per_shard=100)
        except BaseException as e:  # reported below, in the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=first)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (out / ".staging").exists() and thread.is_alive():
            assert time.monotonic() < deadline, "the first conversion never started writing"
            time.sleep(0.05)
        with pytest.raises(chute.StoreLockedError):
            chute.ray.write_dataset(_source(2), out, overwrite=True)
        with pytest.raises((chute.StoreLockedError, FileExistsError)):
            chute.ray.write_dataset(_source(2), out)
    finally:
        go.touch()
        thread.join(timeout=120)
    assert not thread.is_alive() and "error" not in outcome, outcome
    _check_chute(out)
    again = chute.ray.write_dataset(_source(2), out, columns=["label"], overwrite=True)
    assert again["label"][:].tolist() == LABELS.tolist()  # the lock is free once it is done


def test_a_reader_of_a_column_raises_when_the_conversion_is_overwritten(
    local_ray: None, tmp_path: Path
) -> None:
    """An overwrite clears each old column as a sharded overwrite does: its readers raise
    `StoreChangedError` instead of mixing old shards they had opened with new ones."""
    path = tmp_path / "conv"
    rows = ray.data.from_items([{"x": np.full(2, i)} for i in range(40)], override_num_blocks=4)
    chute.ray.write_dataset(rows, path, rows_per_shard=10)["x"].close()
    old = chute.Dataset(path / "x")
    assert old[[0]].tolist() == [[0, 0]]  # opens the first shard only
    again = ray.data.from_items([{"x": np.full(2, -i)} for i in range(40)], override_num_blocks=4)
    new = chute.ray.write_dataset(again, path, rows_per_shard=10, overwrite=True)
    with pytest.raises(chute.StoreChangedError):
        old[[39]]
    old.close()
    assert new["x"][[39]].tolist() == [[-39, -39]]
    new["x"].close()


@pytest.mark.parametrize("sharded", [True, False])
def test_an_overwrite_replaces_a_dataset_at_the_folder_itself(
    local_ray: None, tmp_path: Path, sharded: bool
) -> None:
    """A conversion over a folder holding a dataset removes it as `chute.write_dataset`'s
    overwrite does: chute.Dataset(path) no longer opens the old data, its readers raise."""
    path = tmp_path / "d"
    chute.write_dataset(path, np.arange(10), shard_records=4 if sharded else None).close()
    old = chute.Dataset(path)
    assert old[[0]].tolist() == [0]
    rows = ray.data.from_items([{"v": i * 10} for i in range(5)], override_num_blocks=1)
    new = chute.ray.write_dataset(path, rows, shard_records=4, overwrite=True)
    assert new["v"][:].tolist() == [0, 10, 20, 30, 40]
    with pytest.raises(chute.StoreChangedError):
        old[[9]]
    old.close()
    assert not list(path.glob("part-*")) and not (path / "dataset.json").exists()
    assert not (path / "meta.zr").exists() and not list(path.glob("[0-9]*.zr"))
    with pytest.raises(chute.StoreNotFoundError):
        chute.Dataset(path)
    assert chute.ray.open_columns(path)["v"][:].tolist() == [0, 10, 20, 30, 40]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "nested", "link-out"])
def test_a_hostile_columns_file_is_an_error_naming_it(tmp_path: Path, kind: str) -> None:
    """columns.json is read as every file chute is pointed at: a regular file inside the
    folder, with a bound; a FIFO hung the open, /dev/zero read until memory ran out."""
    import subprocess
    import sys
    import textwrap

    conv = tmp_path / "conv"
    conv.mkdir()
    columns = conv / "columns.json"
    if kind == "fifo":
        os.mkfifo(columns)
    elif kind == "dev-zero":
        columns.symlink_to("/dev/zero")
    elif kind == "folder":
        columns.mkdir()
    elif kind == "nested":
        columns.write_text("[" * 100_000)
    else:
        (tmp_path / "outside.json").write_text("{}")
        columns.symlink_to(tmp_path / "outside.json")
    child = textwrap.dedent(f"""
        import sys, chute.ray
        try:
            chute.ray.open_columns({str(conv)!r})
        except chute.ChuteError as e:
            sys.exit(0 if "columns.json" in str(e) else 3)
        sys.exit(4)
    """)
    done = subprocess.run([sys.executable, "-c", child], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


@pytest.mark.parametrize(
    ("field", "value"),
    [("records", "5"), ("records", True), ("records", 5.0), ("columns", [{"name": "x"}]),
     ("columns", [{"name": "x", "kind": "weird"}]), ("columns", [{"name": "..", "kind": "fixed"}])],
)  # fmt: skip
def test_a_columns_file_of_wrong_types_is_damage_naming_it(
    tmp_path: Path, field: str, value: Any
) -> None:
    import json

    from chute.datasets._internal import checksum_of

    chute.write_dataset(tmp_path / "x", np.arange(5), shard_records=4).close()
    doc = {"format": "chute-columns", "version": 1, "records": 5,
           "columns": [{"name": "x", "kind": "fixed"}]}  # fmt: skip
    doc[field] = value
    doc["checksum"] = checksum_of(doc)
    (tmp_path / "columns.json").write_text(json.dumps(doc))
    with pytest.raises(chute.CorruptStoreError, match=r"columns\.json"):
        chute.ray.open_columns(tmp_path)
