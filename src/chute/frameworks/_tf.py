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
    iteration of the dataset is one pass over the view. (Example and test in
    ``tests/insitu/test_tf.py``, run by ``make test-tf``: TensorFlow lives apart.)

    The example is skipped under ``make test``: TensorFlow cannot be imported in the
    process that holds torch and JAX, so it only runs in the ``.venv-tf`` environment.

    >>> from chute.insitu import InSituDataset
    >>> from chute.frameworks import as_tf_dataset
    >>> ds = InSituDataset("era5.zarr", batch_size=32)  # doctest: +SKIP
    >>> for batch in as_tf_dataset(ds.train):  # doctest: +SKIP
    ...     model.train_on_batch(batch["t2m"])
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
