"""Hand a batch to torch or JAX without copying (DLPack), a loader's batches to a device
with the copies overlapped (`to_device`), and in-place Zarr views to torch or TensorFlow.

Install the framework yourself (``pip install 'chute[torch]'`` or ``'chute[jax]'``); chute's core
never imports one. Every numpy array found in the batch (dict values, tuples such as ragged
``(values, row_splits)``, nested dicts) becomes a framework array over the same memory; other
leaves pass through unchanged. An array the framework cannot share safely is first copied
into a native, contiguous one: for torch one that is read-only, byte-swapped, unaligned or has a
negative or uneven stride (a flipped image); for JAX read-only, byte-swapped or strided. A dtype
torch has no tensor for (``S<n>``, ``U<n>``, datetime64, structured, object) is a ``TypeError``
naming the batch key.
"""

from chute.frameworks._device import DeviceLoader, DeviceView, to_device
from chute.frameworks._insitu_torch import as_torch
from chute.frameworks._jax import to_jax
from chute.frameworks._tf import as_tf_dataset
from chute.frameworks._torch import to_torch

__all__ = [
    "DeviceLoader",
    "DeviceView",
    "as_tf_dataset",
    "as_torch",
    "to_device",
    "to_jax",
    "to_torch",
]
