"""torch hand-off: numpy batches as tensors over the same memory (DLPack)."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from chute.frameworks._tree import native_copy, tree_map

__all__ = ["to_torch"]


def to_torch(batch: Any, device: Any = None) -> Any:
    """The batch with every numpy array as a ``torch.Tensor`` sharing its memory.

    With ``device`` (e.g. ``"cuda"``) the tensors are then moved there (a copy, as any
    host-to-device transfer is).
    """
    from torch.utils.dlpack import from_dlpack

    def convert(array: npt.NDArray[Any]) -> Any:
        try:
            tensor = from_dlpack(array)
        except BufferError:
            tensor = from_dlpack(native_copy(array))
        return tensor if device is None else tensor.to(device, non_blocking=True)

    return tree_map(batch, convert)
