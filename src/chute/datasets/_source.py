"""`RecordSource`: what the typed layer reads records from, as one small interface.

A dataset (`Dataset`, `RaggedDataset`) holds a source, never a concrete store: one
Zrecord store (`chute.RecordStore`), a sharded dataset's shards (`ShardedStore`), and the
next kind (a dataset in object storage) are each one more implementation. Every source reads
records by a dense index ``0..len``, checks indices with the one normaliser (a wrong one is
`RecordIndexError`) and reports ``verify()`` with the same keys (`VerifyReport`). Where a
source cannot do something, a capability flag says so (as zarr's ``Store.supports_writes``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from chute.store._internal import IndexLike, VerifyReport


@runtime_checkable
class RecordSource(Protocol):
    """A read source of byte records addressed by a dense index ``0..len(source)``.

    >>> import tempfile, numpy as np, chute
    >>> from chute.datasets import RecordSource
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x", np.arange(6), shard_records=4)
    >>> source = ds.store
    >>> isinstance(source, RecordSource), source.supports_writes, len(source)
    (True, False, 6)
    >>> source.lengths([0, 5]).tolist(), source.verify()["checked"]
    ([8, 8], 6)
    """

    @property
    def path(self) -> Path | str:
        """Where the records are: a folder, or a URL."""
        ...

    @property
    def supports_writes(self) -> bool:
        """Whether records can be appended or deleted through this handle."""
        ...

    @property
    def supports_growth(self) -> bool:
        """Whether ``len`` may grow while the source is open (a writer's appends seen)."""
        ...

    @property
    def has_checksums(self) -> bool:
        """Whether every record has a checksum to verify it against."""
        ...

    def __len__(self) -> int: ...

    def lengths(self, indices: IndexLike) -> npt.NDArray[np.uint32]:
        """Decoded byte size of each record."""
        ...

    def gather(
        self,
        indices: IndexLike,
        out: npt.NDArray[Any] | None = None,
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> npt.NDArray[Any]:
        """Decode equal-size records into the rows of ``out`` (a new uint8 array if None)."""
        ...

    def gather_packed(
        self,
        indices: IndexLike,
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
        """Decode records of any sizes end to end: ``(values, offsets)``, n+1 offsets."""
        ...

    def gather_into(
        self,
        indices: IndexLike,
        out: npt.NDArray[Any],
        offsets: npt.NDArray[np.integer[Any]] | Sequence[int],
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> npt.NDArray[Any]:
        """Decode record i to byte ``offsets[i]`` of ``out``."""
        ...

    def stats(self) -> dict[str, Any]:
        """Record count, bytes live and stored, records per codec."""
        ...

    def verify(
        self, batch: int = 4096, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Decode every record and check its checksum; damage is reported, not raised."""
        ...

    def close(self) -> None:
        """Release the source; idempotent."""
        ...
