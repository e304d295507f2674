"""Metric log in the Plättli format: per-step metrics, columnar on disk, crash-safe.

Writers: `DirectWriter` (straight to column files), `CompactingWriter` (hot log,
background compaction) and `BulkWriter` (in memory, written once). `Reader` reads
live or finished runs, folders or `metrics.plattli` archives. With ``clock=True`` a
streaming writer logs `CLOCK_WALL` and `CLOCK_ELAPSED` at every step: a wall clock you do
not write yourself, and the run's elapsed time, which a resume continues.
`SummaryWriter` takes torch's ``torch.utils.tensorboard.SummaryWriter`` calls, and
`from_tensorboard` (``chute metrics from-tensorboard``) converts TensorBoard event files.
"""

from chute.errors import (
    BadArchiveError,
    CorruptRunError,
    MetricValueError,
    MetricWrittenTwiceError,
    QueryError,
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
from ._streaming import CLOCK_ELAPSED, CLOCK_WALL
from ._summary import SummaryWriter
from ._tensorboard import from_tensorboard

__all__ = [
    "CLOCK_ELAPSED",
    "CLOCK_WALL",
    "BadArchiveError",
    "BulkWriter",
    "CompactingWriter",
    "CorruptRunError",
    "DirectWriter",
    "MetricValueError",
    "MetricWrittenTwiceError",
    "QueryError",
    "Reader",
    "RunFileMissingError",
    "RunFinalizedError",
    "RunHasStepsError",
    "RunLockedError",
    "StepOrderError",
    "SummaryWriter",
    "WriterClosedError",
    "from_tensorboard",
    "is_run",
    "is_run_dir",
    "resolve_run_dir",
]
