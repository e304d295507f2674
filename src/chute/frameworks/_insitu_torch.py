"""torch surface of the in-place Zarr loader: a split view as a torch ``IterableDataset``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from chute.frameworks._torch import to_torch

if TYPE_CHECKING:
    from chute.insitu import SplitView

__all__ = ["as_torch"]


def as_torch(view: SplitView, device: Any = None) -> Any:
    """``view`` as a torch ``IterableDataset`` of ``{key: torch.Tensor}`` batches.

    Use it with ``DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)``: the
    batches are already made (``batch_size=None``) and the loader runs its reads and
    decodes on its own threads (worker processes would each read the whole split, so
    they are refused). Tensors share the batch's memory through DLPack; with
    ``device`` they are then moved there. Each iteration is one pass over the view.

    >>> import tempfile, numpy as np, zarr
    >>> from torch.utils.data import DataLoader
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> path = tempfile.mkdtemp() + "/a.zarr"
    >>> zarr.create_array(path, shape=(80, 3), chunks=(8, 3), dtype="f4")[:] = 1.0
    >>> ds = InSituDataset(path, split_by_chunk(open_geometries(path)["a"]), batch_size=8)
    >>> [b["a"].shape for b in DataLoader(as_torch(ds.val), batch_size=None)]
    [torch.Size([8, 3])]
    >>> ds.close()
    """
    from torch.utils.data import IterableDataset, get_worker_info

    class ViewDataset(IterableDataset):  # type: ignore[misc, type-arg]
        def __iter__(self) -> Iterator[Any]:
            if get_worker_info() is not None:
                raise RuntimeError(
                    "use DataLoader(..., num_workers=0) with as_torch(view): the in-place "
                    "loader reads on its own threads, and each worker process would read "
                    "the whole split again"
                )
            for batch in view:
                yield to_torch(batch, device)

        def __len__(self) -> int:
            return len(view)

        def __repr__(self) -> str:
            return f"as_torch({view!r})"

    return ViewDataset()
