"""Metric log in the Plättli format: per-step metrics, columnar on disk, crash-safe.

Writers: `DirectWriter` (straight to column files), `CompactingWriter` (hot log,
background compaction) and `BulkWriter` (in memory, written once). `Reader` reads
live or finished runs, folders or `metrics.plattli` archives.
"""

from chute.errors import (
    BadArchiveError,
    CorruptRunError,
    MetricValueError,
    MetricWrittenTwiceError,
    RunFileMissingError,
    RunFinalizedError,
    RunHasStepsError,
    RunLockedError,
    StepOrderError,
    WriterClosedError,
)

from ._bulk import BulkWriter
from ._compacting import CompactingWriter
from ._direct import DirectWriter
from ._reader import Reader
from ._source import is_run, is_run_dir, resolve_run_dir

__all__ = [
    "BadArchiveError",
    "BulkWriter",
    "CompactingWriter",
    "CorruptRunError",
    "DirectWriter",
    "MetricValueError",
    "MetricWrittenTwiceError",
    "Reader",
    "RunFileMissingError",
    "RunFinalizedError",
    "RunHasStepsError",
    "RunLockedError",
    "StepOrderError",
    "WriterClosedError",
    "is_run",
    "is_run_dir",
    "resolve_run_dir",
]
