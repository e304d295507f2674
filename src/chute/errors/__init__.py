"""Every exception chute raises on purpose: one family under `ChuteError`.

Each class also derives from the built-in a caller would catch for the same condition
(`RuntimeError`, `ValueError`, `OSError` ...), so code written against those keeps working.
"""

from __future__ import annotations

from chute.errors._base import (
    ChuteError,
)
from chute.errors._loader import (
    LoaderInUseError,
    LoaderTimeoutError,
    LoaderWorkerError,
    SamplerError,
    StateMismatchError,
)
from chute.errors._metrics import (
    BadArchiveError,
    BadChunkError,
    CorruptRunError,
    MetricValueError,
    MetricWrittenTwiceError,
    NarrowingError,
    PlotError,
    QueryError,
    RunFileMissingError,
    RunFinalizedError,
    RunHasStepsError,
    RunLockedError,
    RunNotFoundError,
    StepOrderError,
    WriterClosedError,
)
from chute.errors._store import (
    CacheTooSmallError,
    ChecksumError,
    ColumnTypeError,
    CorruptStoreError,
    IncompleteDatasetError,
    OutBufferError,
    RecordDecodeError,
    RecordIndexError,
    RemoteChangedError,
    RemoteError,
    RemoteNotFoundError,
    SchemaMismatchError,
    StoreChangedError,
    StoreClosedError,
    StoreError,
    StoreKindError,
    StoreLockedError,
    StoreNotFoundError,
    UnsafeFileError,
)

__all__ = [
    "BadArchiveError",
    "BadChunkError",
    "CacheTooSmallError",
    "ChecksumError",
    "ChuteError",
    "ColumnTypeError",
    "CorruptRunError",
    "CorruptStoreError",
    "IncompleteDatasetError",
    "LoaderInUseError",
    "LoaderTimeoutError",
    "LoaderWorkerError",
    "MetricValueError",
    "MetricWrittenTwiceError",
    "NarrowingError",
    "OutBufferError",
    "PlotError",
    "QueryError",
    "RecordDecodeError",
    "RecordIndexError",
    "RemoteChangedError",
    "RemoteError",
    "RemoteNotFoundError",
    "RunFileMissingError",
    "RunFinalizedError",
    "RunHasStepsError",
    "RunLockedError",
    "RunNotFoundError",
    "SamplerError",
    "SchemaMismatchError",
    "StateMismatchError",
    "StepOrderError",
    "StoreChangedError",
    "StoreClosedError",
    "StoreError",
    "StoreKindError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnsafeFileError",
    "WriterClosedError",
]

for _name in __all__:  # each class shows (and pickles) as chute.errors.<name>, where users find it
    globals()[_name].__module__ = __name__
del _name
