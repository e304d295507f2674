"""TensorFlow surface of the in-place Zarr loader: a split view as a ``tf.data.Dataset``.

TensorFlow is kept out of the processes that load torch or JAX (they ship clashing
native runtimes), so its tests run in an environment of their own (``make test-tf``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chute.insitu import SplitView

__all__ = ["as_tf_dataset"]


def as_tf_dataset(view: SplitView, output_signature: Any = None) -> Any:
    """``view`` as a ``tf.data.Dataset`` of ``{key: tf.Tensor}`` batches.

    The ``output_signature`` (a ``tf.TensorSpec`` per key, the batch axis ``None``, so the
    short last batch fits) comes from ``view.dataset.batch_spec()`` unless given. Each
    iteration of the dataset is one pass over the view. (Its test is in
    ``tests/insitu/test_tf.py``, run by ``make test-tf``: TensorFlow lives apart.)

    The example is skipped under ``make test``: TensorFlow cannot be imported in the
    process that holds torch and JAX, so it only runs in the ``.venv-tf`` environment.

    >>> import tempfile, numpy as np, zarr
    >>> from chute.frameworks import as_tf_dataset
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> ds = InSituDataset(path, manifest, batch_size=8)
    >>> val = as_tf_dataset(ds.val)  # doctest: +SKIP
    >>> val.element_spec["t2m"]  # doctest: +SKIP
    TensorSpec(shape=(None, 2), dtype=tf.float32, name=None)
    >>> [batch["t2m"].shape.as_list() for batch in val]  # doctest: +SKIP
    [[8, 2], [2, 2]]
    >>> ds.close()
    """
    import tensorflow as tf

    if output_signature is None:
        output_signature = {
            key: tf.TensorSpec(shape=shape, dtype=tf.as_dtype(dtype))
            for key, (shape, dtype) in view.dataset.batch_spec().items()
        }

    def batches() -> Iterator[dict[str, Any]]:
        for batch in view:
            yield dict(batch)

    return tf.data.Dataset.from_generator(batches, output_signature=output_signature)
