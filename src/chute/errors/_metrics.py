"""Errors of the metric log: runs, writers, readers, plots."""

from __future__ import annotations

from chute.errors._base import ChuteError


class RunLockedError(ChuteError, RuntimeError):
    """Another writer (in another process) holds the metric run.

    >>> import subprocess, sys, tempfile
    >>> from chute.metrics import DirectWriter
    >>> run = tempfile.mkdtemp()
    >>> w = DirectWriter(run)
    >>> code = "import sys; from chute.metrics import DirectWriter; DirectWriter(sys.argv[1])"
    >>> err = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True)
    >>> "RunLockedError" in err.stderr
    True
    >>> w.close()
    """


class RunHasStepsError(ChuteError, FileExistsError):
    """A metric writer was opened without `step=` on a run that already holds steps.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter, RunHasStepsError
    >>> run = tempfile.mkdtemp()
    >>> with DirectWriter(run) as w:
    ...     w.write(loss=0.5); w.end_step()
    >>> try:
    ...     DirectWriter(run)  # resume or restart? the writer will not guess
    ... except RunHasStepsError as e:
    ...     print(str(e).split("; ")[1])
    pass step=1 to resume after them, or step=0 to start over (which deletes them)
    >>> DirectWriter(run, step=1).close()
    """


class RunFinalizedError(ChuteError, FileExistsError, RuntimeError):
    """A finalized run (`metrics.plattli`) was reopened without `allow_resume_finalized=True`.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter, RunFinalizedError
    >>> run = tempfile.mkdtemp()
    >>> w = DirectWriter(run); w.write(loss=0.5); w.end_step(); w.finish()
    >>> try:
    ...     DirectWriter(run, step=1)
    ... except RunFinalizedError:
    ...     w = DirectWriter(run, step=1, allow_resume_finalized=True)  # on purpose
    >>> w.step
    1
    >>> w.close()
    """


class MetricWrittenTwiceError(ChuteError, ValueError, RuntimeError):
    """A metric was written twice in one step.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter, MetricWrittenTwiceError
    >>> with DirectWriter(tempfile.mkdtemp()) as w:
    ...     w.write(loss=0.5)
    ...     try:
    ...         w.write(loss=0.4)  # forgot end_step()
    ...     except MetricWrittenTwiceError as e:
    ...         print(e)
    metric 'loss' was already written at step 0
    """


class StepOrderError(ChuteError, ValueError):
    """A metric writer's step was moved back over steps it already wrote.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter, StepOrderError
    >>> with DirectWriter(tempfile.mkdtemp()) as w:
    ...     for loss in (0.9, 0.7, 0.6):
    ...         w.write(loss=loss); w.end_step()
    ...     try:
    ...         w.step = 1
    ...     except StepOrderError as e:
    ...         print(str(e).split("; ")[0])
    cannot move the step back to 1: step 2 is already written
    """


class CorruptRunError(ChuteError, ValueError):
    """A metric run's files contradict the format (a bad line, a member whose CRC-32 differs).

    ``path`` names the damaged file; ``line`` is its 1-based line number where one applies.

    >>> import os, tempfile
    >>> from chute.metrics import CorruptRunError, Reader
    >>> run = tempfile.mkdtemp()
    >>> with open(os.path.join(run, "metrics.plattli"), "wb") as f:
    ...     _ = f.write(b"not a zip")  # a damaged archive
    >>> try:
    ...     Reader(run)
    ... except CorruptRunError as e:
    ...     print(os.path.basename(e.path))
    metrics.plattli
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class BadArchiveError(CorruptRunError, FileNotFoundError):
    """A run's ``metrics.plattli`` is not a zip archive (damaged, or another file under that
    name). A `CorruptRunError` naming the file; also a FileNotFoundError, which plattli
    raises for it ("not a plattli run"), so code catching that keeps working.

    >>> import os, tempfile
    >>> from chute.metrics import Reader
    >>> run = tempfile.mkdtemp()
    >>> with open(os.path.join(run, "metrics.plattli"), "wb") as f:
    ...     _ = f.write(b"not a zip")
    >>> try:
    ...     Reader(run)
    ... except FileNotFoundError as e:
    ...     print(type(e).__name__, os.path.basename(e.path))
    BadArchiveError metrics.plattli
    """


class MetricValueError(ChuteError, TypeError, ValueError, OverflowError):
    """A value a metric cannot take: not a scalar (a list, an array of several values) or
    not a number for a numeric metric, a float for an integer one, an integer past 64 bits.
    An instance of each built-in plattli raises for one of these cases (ValueError for a
    value that is not a scalar, TypeError for a mix of kinds, OverflowError for a range),
    so code catching any of them keeps working.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter
    >>> with DirectWriter(tempfile.mkdtemp()) as w:
    ...     w.write(loss=0.5); w.end_step()
    ...     try:
    ...         w.write(loss=[0.1, 0.2])
    ...     except ValueError as e:
    ...         print(type(e).__name__)
    MetricValueError
    """


class RunFileMissingError(CorruptRunError, FileNotFoundError):
    """A file the run's manifest names (or the manifest of an archive) is absent.

    >>> import os, tempfile
    >>> from chute.metrics import DirectWriter, Reader, RunFileMissingError
    >>> run = tempfile.mkdtemp()
    >>> with DirectWriter(run) as w:
    ...     w.write(loss=0.5); w.end_step()
    >>> os.remove(os.path.join(run, "plattli", "loss.f64"))
    >>> with Reader(run) as r:
    ...     try:
    ...         r.metric("loss")
    ...     except RunFileMissingError as e:
    ...         print(str(e).split(" is missing ")[1])
    but the manifest lists metric 'loss'; the run is damaged
    """


class WriterClosedError(ChuteError, RuntimeError):
    """The metric writer was finished, closed, or taken over by a newer writer of the run.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter
    >>> run = tempfile.mkdtemp()
    >>> old = DirectWriter(run)
    >>> new = DirectWriter(run)  # a restarted loop in the same process takes the run over
    >>> try:
    ...     old.write(loss=1.0)
    ... except RuntimeError as e:
    ...     print(type(e).__name__)
    WriterClosedError
    >>> new.close()
    """


class BadChunkError(ChuteError, RuntimeError):
    """A stored Zarr chunk could not be read or decoded; ``key`` is its store key.

    ``InSituDataset(on_bad_chunk="raise")`` raises it; ``"skip"`` lists the key instead.

    >>> from chute.insitu import BadChunkError
    >>> e = BadChunkError("t2m/c/3/0/0", OSError("truncated"))
    >>> e.key, str(e)
    ('t2m/c/3/0/0', "bad chunk 't2m/c/3/0/0': OSError: truncated")
    """

    def __init__(self, key: str, cause: BaseException) -> None:
        super().__init__(f"bad chunk {key!r}: {type(cause).__name__}: {cause}")
        self.key = key


class NarrowingError(ChuteError, ValueError):
    """A value does not fit the narrower dtype a framework would hold it in (JAX with
    64-bit types off).

    >>> import numpy as np
    >>> from chute.errors import NarrowingError
    >>> from chute.frameworks import to_jax
    >>> try:
    ...     to_jax({"ids": np.array([2**40])})  # int64 that int32 cannot hold
    ... except NarrowingError as e:
    ...     print(str(e).split(", which")[0])
    int64 values in [1099511627776, 1099511627776] do not fit int32
    """


class PlotError(ChuteError, ValueError):
    """A curve cannot be drawn as asked: a text metric, a missing metric or x axis, an x
    that does not increase, a smoothing factor out of range, or an unwritable image type.

    The command line reports it as a message and exit status 1:

    >>> import contextlib, sys, tempfile
    >>> from chute import cli
    >>> from chute.metrics import DirectWriter
    >>> run = tempfile.mkdtemp()
    >>> with DirectWriter(run) as w:
    ...     w.write(note="warmup"); w.end_step()
    >>> with contextlib.redirect_stderr(sys.stdout):
    ...     code = cli.main(["metrics", "plot", run, "note", "-o", run + "/note.png"])
    chute metrics plot: metric 'note' of run '...' holds text, not numbers; it cannot be plotted
    >>> code
    1
    """


class RunNotFoundError(ChuteError, FileNotFoundError):
    """No metric run, and no folder to search for runs, at the given path.

    >>> import tempfile
    >>> from chute.errors import RunNotFoundError
    >>> from chute.metrics.dashboard import create_app
    >>> try:
    ...     create_app([tempfile.mkdtemp() + "/typo"])
    ... except RunNotFoundError as e:
    ...     print(str(e).split(":")[0])
    no such run or folder
    """


class QueryError(ChuteError, ValueError):
    """A query filtering runs (``chute metrics ls --where``, the dashboard) that does not
    parse; the message names the problem and ``position``, its character offset from 0.

    >>> from chute.metrics import QueryError
    >>> from chute.metrics._query import parse
    >>> try:
    ...     parse("lr < 1e-3 and (depth > 12")
    ... except QueryError as e:
    ...     print(e.position, e)
    25 unclosed '(' at 14: expected ')', found the end at 25
    """

    def __init__(self, problem: str, position: int | None = None) -> None:
        super().__init__(problem if position is None else f"{problem} at {position}")
        self.position = position
