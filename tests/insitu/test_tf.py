"""TensorFlow surface: a split view as a tf.data.Dataset (run by ``make test-tf``, in an
environment without torch or JAX; skipped where TensorFlow is not installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chute.insitu import InSituDataset, StandardScaler, open_geometries, split_by_chunk

from .conftest import x_values

tf = pytest.importorskip("tensorflow")


def test_as_tf_dataset_yields_the_view_with_a_correct_signature(archive: Path) -> None:
    from chute.frameworks import as_tf_dataset

    m = split_by_chunk(open_geometries(archive)["x"])
    scaler = StandardScaler(mean={"y": 0.0}, std={"y": 1.0})  # y: int64 -> float32
    with InSituDataset(archive, m, batch_size=16, chunk_transforms=[scaler]) as ds:
        tfds = as_tf_dataset(ds.train)
        spec = tfds.element_spec
        assert spec["x"].shape.as_list() == [None, 3, 5] and spec["x"].dtype == tf.float32
        assert spec["y"].dtype == tf.float32 and spec["sample_indices"].dtype == tf.int64
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen = []
            for b in tfds:
                idx = b["sample_indices"].numpy()
                np.testing.assert_array_equal(b["x"].numpy(), x_values(idx))
                np.testing.assert_array_equal(b["y"].numpy(), idx.astype(np.float32))
                seen.extend(idx.tolist())
            assert sorted(seen) == m.sample_indices("train").tolist()
        assert len(list(tfds.take(2))) == 2  # a pass left early frees the view again
        ds.set_epoch(0)
        assert sum(len(b["y"]) for b in tfds) == len(m.sample_indices("train"))
        last = list(as_tf_dataset(ds.val))[-1]  # a short last batch fits the signature too
        assert last["x"].shape[0] == (len(m.sample_indices("val")) % 16 or 16)
