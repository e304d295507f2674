"""Every exception chute raises on purpose: one family under `ChuteError`.

Each class also derives from the built-in a caller would catch for the same condition
(`RuntimeError`, `ValueError`, `OSError` ...), so code written against those keeps working.
"""

from __future__ import annotations

__all__ = [
    "BadChunkError",
    "ChecksumError",
    "ChuteError",
    "CorruptRunError",
    "CorruptStoreError",
    "IncompleteDatasetError",
    "MetricWrittenTwiceError",
    "NarrowingError",
    "PlotError",
    "RecordIndexError",
    "RunFileMissingError",
    "RunFinalizedError",
    "RunHasStepsError",
    "RunLockedError",
    "RunNotFoundError",
    "SchemaMismatchError",
    "StepOrderError",
    "StoreChangedError",
    "StoreClosedError",
    "StoreError",
    "StoreKindError",
    "StoreLockedError",
    "StoreNotFoundError",
    "WriterClosedError",
]


class ChuteError(Exception):
    """Base class of every error chute raises on purpose."""


class StoreError(ChuteError):
    """A store cannot be opened or used as asked."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path holds no store (and the mode does not create one)."""


class StoreLockedError(StoreError):
    """Another writer (handle or process) holds the store."""


class StoreClosedError(StoreError, ValueError):
    """The store was closed."""


class StoreChangedError(StoreError, RuntimeError):
    """A delete, compaction or reset changed the store since this reader opened it (or
    while it read): the records it would return may be gone or moved. Reopen the store."""


class CorruptStoreError(StoreError):
    """Bytes on disk contradict the format: a damaged table, chunk, frame or dictionary.

    ``index`` is the record index that exposed the damage, when one did.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class ChecksumError(CorruptStoreError):
    """A record decoded cleanly but its bytes differ from the CRC-32C written with it."""


class IncompleteDatasetError(CorruptStoreError):
    """A sharded dataset whose write has not finished: shards on disk but no manifest yet."""


class StoreKindError(StoreError, ValueError):
    """The store holds the other kind of records: fixed-shape for `RaggedDataset`, or
    variable-length for `Dataset` (a ValueError, as in loaderx)."""


class SchemaMismatchError(StoreError, ValueError):
    """Records to append differ from the store's schema.json in dtype or record shape (a
    ValueError, as in loaderx)."""


class RecordIndexError(ChuteError, IndexError, RuntimeError):
    """A record index outside the dataset. An IndexError, as in numpy; also a RuntimeError,
    which is what loaderx raises for it, so code catching either keeps working."""


class RunLockedError(ChuteError, RuntimeError):
    """Another writer (in another process) holds the metric run."""


class RunHasStepsError(ChuteError, FileExistsError):
    """A metric writer was opened without `step=` on a run that already holds steps."""


class RunFinalizedError(ChuteError, FileExistsError, RuntimeError):
    """A finalized run (`metrics.plattli`) was reopened without `allow_resume_finalized=True`."""


class MetricWrittenTwiceError(ChuteError, ValueError, RuntimeError):
    """A metric was written twice in one step."""


class StepOrderError(ChuteError, ValueError):
    """A metric writer's step was moved back over steps it already wrote."""


class CorruptRunError(ChuteError, ValueError):
    """A metric run's files contradict the format (a bad line, a member whose CRC-32 differs).

    ``path`` names the damaged file; ``line`` is its 1-based line number where one applies.
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class RunFileMissingError(CorruptRunError, FileNotFoundError):
    """A file the run's manifest names (or the manifest of an archive) is absent."""


class WriterClosedError(ChuteError, RuntimeError):
    """The metric writer was finished, closed, or taken over by a newer writer of the run."""


class BadChunkError(ChuteError, RuntimeError):
    """A stored Zarr chunk could not be read or decoded; ``key`` is its store key."""

    def __init__(self, key: str, cause: BaseException) -> None:
        super().__init__(f"bad chunk {key!r}: {type(cause).__name__}: {cause}")
        self.key = key


class NarrowingError(ChuteError, ValueError):
    """A value does not fit the narrower dtype a framework would hold it in (JAX with
    64-bit types off)."""


class PlotError(ChuteError, ValueError):
    """A curve cannot be drawn as asked: a text metric, a missing metric or x axis, an x
    that does not increase, a smoothing factor out of range, or an unwritable image type."""


class RunNotFoundError(ChuteError, FileNotFoundError):
    """No metric run, and no folder to search for runs, at the given path."""
