"""Datasets pickle by path, so worker processes started with spawn or forkserver reopen them."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import chute

ARRAY = np.arange(50 * 4, dtype=np.int16).reshape(50, 4)
SEQS = [np.arange(n, dtype=np.float32) for n in (0, 3, 1, 7, 2, 5)]


def test_views_pickle_and_reopen_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ds = chute.write_dataset("a.zr", ARRAY)  # a relative path: the copy must not depend on cwd
    rds = chute.write_ragged("r.zr", SEQS)
    verified = chute.Dataset("a.zr", verify=True, threads=2)
    blobs = [pickle.dumps(v) for v in (ds, rds, verified)]
    monkeypatch.chdir("/")
    ds2, rds2, verified2 = (pickle.loads(b) for b in blobs)
    assert ds2.path.resolve() == (tmp_path / "a.zr").resolve() and np.array_equal(ds2[:], ARRAY)
    assert all(np.array_equal(rds2[i], s) for i, s in enumerate(SEQS))
    assert isinstance(rds2, chute.RaggedDataset)
    assert verified2._verify and verified2._threads == 2
    ds.close()
    assert np.array_equal(pickle.loads(pickle.dumps(ds))[3], ARRAY[3])  # reopens even if closed


def test_torch_dataloader_with_spawned_workers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ds = chute.write_dataset(tmp_path / "a.zr", ARRAY)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context="spawn", shuffle=False
    )
    got = torch.cat(list(loader)).numpy()
    np.testing.assert_array_equal(got, ARRAY)


def test_torch_workers_read_a_ragged_dataset(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    rds = chute.write_ragged(tmp_path / "r.zr", SEQS)
    loader = torch.utils.data.DataLoader(
        rds, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    got = [t.numpy() for t in loader]
    assert len(got) == len(SEQS)
    assert all(np.array_equal(g, s) for g, s in zip(got, SEQS, strict=True))
