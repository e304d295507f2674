"""The record-source interface: RecordStore and ShardedStore read alike, and a wrong index is
the same RecordIndexError from every entry point of the record layers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import RecordStore
from chute.cli import main as cli
from chute.datasets import RecordSource, ShardedStore
from chute.errors import ChuteError, RecordIndexError
from tests.objects.remote import Serve

ROWS = np.arange(40, dtype=np.int32).reshape(10, 4)


@pytest.fixture(params=["one", "sharded"])
def source(request: pytest.FixtureRequest, tmp_path: Path, serve: Serve) -> Any:
    sharded = request.param == "sharded"
    path = tmp_path / "d"
    chute.write_dataset(path, ROWS, **({"shard_records": 4} if sharded else {})).close()
    opened = serve.open(ShardedStore if sharded else RecordStore, path)
    yield opened
    opened.close()


def test_both_stores_are_record_sources_with_one_signature(source: Any) -> None:
    assert isinstance(source, RecordSource)
    assert source.supports_writes is False and len(source) == 10
    idx = [9, 0, 5]
    rows = source.gather(idx, num_threads=1)  # out= optional, num_threads= taken, by both
    assert rows.dtype == np.uint8 and np.array_equal(rows.view(np.int32), ROWS[idx])
    values, _ = source.gather_packed(idx, num_threads=2)
    assert np.array_equal(values.view(np.int32).reshape(3, 4), ROWS[idx])
    out = np.zeros((3, 4), np.int32)
    source.gather_into(idx, out, [0, 16, 32], num_threads=1)
    assert np.array_equal(out, ROWS[idx])
    report = source.verify(progress=lambda done, total: None)
    assert {k: report[k] for k in ("records", "checked", "unchecked", "damaged")} == {
        "records": 10, "checked": 10, "unchecked": 0, "damaged": []
    }  # fmt: skip


def test_a_sharded_verify_reports_a_shard_it_cannot_read_and_checks_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d"
    chute.write_dataset(path, ROWS, shard_records=4).close()
    (path / "part-00001.zr" / "crc32c.chute").unlink()  # a shard chute wrote, sums lost
    with ShardedStore(path) as store:
        report = store.verify()
    assert report["checked"] == 6 and report["damaged"] == []
    parts = report.get("parts", [])
    assert [p["state"] for p in parts] == ["ok", "unreadable", "ok"]
    assert "checksums are lost" in str(parts[1]["message"])
    assert cli(["verify", "-q", str(path)]) == 1


def _entry_points(tmp_path: Path, serve: Serve) -> dict[str, Callable[[Any], object]]:
    one, many = tmp_path / "one", tmp_path / "many"
    chute.write_dataset(one, ROWS).close()
    chute.write_dataset(many, ROWS, shard_records=4).close()
    seqs = [np.arange(k % 3 + 1) for k in range(10)]
    chute.write_ragged(tmp_path / "r1", seqs).close()
    chute.write_ragged(tmp_path / "r2", seqs, shard_records=4).close()
    points: dict[str, Callable[[Any], object]] = {}
    for name, path in (("store", one), ("sharded", many)):
        store = serve.open(RecordStore if name == "store" else ShardedStore, path)
        points |= {
            f"{name}.gather": lambda i, s=store: s.gather(i, np.empty((len(i), 16), np.uint8)),
            f"{name}.gather(out=None)": lambda i, s=store: s.gather(i),
            f"{name}.gather_packed": lambda i, s=store: s.gather_packed(i),
            f"{name}.gather_into": lambda i, s=store: s.gather_into(
                i, np.empty(16 * len(i), np.uint8), np.arange(len(i)) * 16
            ),
            f"{name}.lengths": lambda i, s=store: s.lengths(i),
        }
    writable = RecordStore(tmp_path / "w", mode="w")
    writable.append([b"a", b"b"])
    points["store.delete"] = lambda i: writable.delete(i)
    for name, path in (("one", one), ("sharded", many)):
        ds = serve.open(chute.Dataset, path)
        points |= {
            f"Dataset({name})[list]": lambda i, d=ds: d[i],
            f"Dataset({name})[int]": lambda i, d=ds: d[int(i[-1])],
            f"Dataset({name}).__getitems__": lambda i, d=ds: d.__getitems__(i),
            f"Dataset({name}).gather_into": lambda i, d=ds: d.gather_into(
                i, np.empty((len(i), 4), np.int32)
            ),
            f"Dataset({name})[mask]": lambda i, d=ds: d[np.ones(len(i) + 20, bool)],
        }
    for name in ("r1", "r2"):
        rd = serve.open(chute.RaggedDataset, tmp_path / name)
        points |= {
            f"RaggedDataset({name})[list]": lambda i, d=rd: d[i],
            f"RaggedDataset({name})[int]": lambda i, d=rd: d[int(i[-1])],
            f"RaggedDataset({name}).lengths": lambda i, d=rd: d.lengths(i),
            f"RaggedDataset({name}).getitems_padded": lambda i, d=rd: d.getitems_padded(i),
        }
    return points


@pytest.mark.parametrize("bad", [[0, 10], [99], [-11]])
def test_a_wrong_index_is_the_same_error_from_every_entry_point(
    tmp_path: Path, bad: list[int], serve: Serve
) -> None:
    wrong: dict[str, str] = {}
    for name, call in _entry_points(tmp_path, serve).items():
        try:
            call(np.array(bad))
        except RecordIndexError as e:
            assert isinstance(e, ChuteError) and isinstance(e, IndexError)
            continue
        except Exception as e:  # collected: the report names every one
            wrong[name] = f"{type(e).__name__}: {e}"
        else:
            wrong[name] = "no error"
    assert wrong == {}


def test_negatives_count_from_the_end_in_datasets_not_in_stores(tmp_path: Path) -> None:
    ds = chute.write_dataset(tmp_path / "d", ROWS, shard_records=4)
    assert ds[[-1]].tolist() == [ROWS[-1].tolist()]
    with pytest.raises(RecordIndexError, match="record index -1 is out of range"):
        ds.store.lengths([-1])
