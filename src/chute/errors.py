"""Every exception chute raises on purpose: one family under `ChuteError`.

Each class also derives from the built-in a caller would catch for the same condition
(`RuntimeError`, `ValueError`, `OSError` ...), so code written against those keeps working.
"""

from __future__ import annotations

__all__ = [
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
    "MetricWrittenTwiceError",
    "NarrowingError",
    "OutBufferError",
    "PlotError",
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


class ChuteError(Exception):
    """Base class of every error chute raises on purpose.

    >>> import chute
    >>> try:
    ...     chute.Dataset("/no/such/store.zr")
    ... except chute.ChuteError as e:
    ...     print(type(e).__name__, isinstance(e, FileNotFoundError))
    StoreNotFoundError True
    """


class StoreError(ChuteError, RuntimeError):
    """A store cannot be opened or used as asked: not found, locked, closed, changed, damaged,
    full, or of another kind. A RuntimeError, as loaderx's ``ZrecordError`` is for the same
    failures, so code catching that keeps working; the narrower classes add the built-in
    that fits (`StoreNotFoundError` is a FileNotFoundError, `StoreClosedError` a ValueError).

    >>> import chute
    >>> [c.__name__ for c in (chute.StoreLockedError, chute.CorruptStoreError)
    ...  if issubclass(c, chute.StoreError)]
    ['StoreLockedError', 'CorruptStoreError']
    """


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path holds no store (and the mode does not create one).

    >>> import tempfile, chute
    >>> try:
    ...     chute.RecordStore(tempfile.mkdtemp() + "/missing.zr", mode="r")
    ... except FileNotFoundError as e:
    ...     print(type(e).__name__)
    StoreNotFoundError
    """


class StoreLockedError(StoreError):
    """Another writer (handle or process) holds the store.

    >>> import tempfile, chute
    >>> path = tempfile.mkdtemp() + "/s.zr"
    >>> with chute.RecordStore(path, mode="w") as writer:
    ...     try:
    ...         chute.RecordStore(path, mode="a")
    ...     except chute.StoreLockedError:
    ...         print("locked")
    locked
    """


class StoreClosedError(StoreError, ValueError):
    """The store was closed.

    >>> import tempfile, numpy as np, chute
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(3))
    >>> ds.close()
    >>> try:
    ...     ds[0]
    ... except ValueError as e:
    ...     print(type(e).__name__)
    StoreClosedError
    """


class StoreChangedError(StoreError):
    """A delete, compaction or reset changed the store since this reader opened it (or
    while it read): the records it would return may be gone or moved. Reopen the store.

    >>> import tempfile, chute
    >>> path = tempfile.mkdtemp() + "/s.zr"
    >>> with chute.RecordStore(path, mode="w") as writer:
    ...     _ = writer.append([b"a", b"b", b"c"])
    >>> reader = chute.RecordStore(path)
    >>> with chute.RecordStore(path, mode="a") as writer:
    ...     writer.delete([0])  # record 2 moves into slot 0
    >>> try:
    ...     reader.gather_packed([0])
    ... except chute.StoreChangedError:
    ...     reader.close(); reader = chute.RecordStore(path)  # reopen: the new state
    >>> reader.gather_packed([0])[0].tobytes(), len(reader)
    (b'c', 2)
    >>> reader.close()
    """


class CorruptStoreError(StoreError):
    """Bytes on disk contradict the format: a damaged table, chunk, frame or dictionary.

    ``index`` is the record index that exposed the damage, when one did.

    >>> import os, tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> chute.write_dataset(path, np.arange(100), codec="raw").close()
    >>> os.truncate(path + "/0.zr", 400)  # cut the chunk file: records 50.. are gone
    >>> try:
    ...     chute.Dataset(path)[[10, 90]]
    ... except chute.CorruptStoreError as e:
    ...     print(e.index)
    90
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class ChecksumError(CorruptStoreError):
    """A record decoded cleanly but its bytes differ from the CRC-32C written with it.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> chute.write_dataset(path, np.zeros((4, 8), np.uint8), codec="raw").close()
    >>> with open(path + "/0.zr", "r+b") as f:  # flip one bit of record 2
    ...     _ = f.seek(17); _ = f.write(b"\x01")
    >>> chute.Dataset(path)[2].tolist()  # without verify the damage reads as data
    [0, 1, 0, 0, 0, 0, 0, 0]
    >>> try:
    ...     chute.Dataset(path, verify=True)[2]
    ... except chute.ChecksumError as e:
    ...     print("record", e.index)
    record 2
    """


class IncompleteDatasetError(CorruptStoreError):
    """A sharded dataset whose write has not finished: shards on disk but no manifest yet.

    >>> import os, tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/big"
    >>> chute.write_dataset(path, np.arange(10), shard_records=4).close()
    >>> os.remove(path + "/dataset.json")  # as if the writer died before committing
    >>> try:
    ...     chute.Dataset(path)
    ... except chute.IncompleteDatasetError as e:
    ...     print(str(e).split(": ", 1)[1])
    its write did not finish (write it again with overwrite=True)
    """


class StoreKindError(StoreError, ValueError):
    """The store holds the other kind of records: fixed-shape for `RaggedDataset`, or
    variable-length for `Dataset` (a ValueError, as in loaderx).

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/tokens.zr"
    >>> chute.write_ragged(path, [np.arange(3), np.arange(5)]).close()
    >>> try:
    ...     chute.Dataset(path)
    ... except chute.StoreKindError as e:
    ...     print(str(e).split(": ")[-1])
    open it with RaggedDataset
    """


class SchemaMismatchError(StoreError, ValueError):
    """Records to append differ from the store's schema.json in dtype or record shape (a
    ValueError, as in loaderx).

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> chute.write_dataset(path, np.zeros((4, 3), np.float32)).close()
    >>> try:
    ...     chute.write_dataset(path, np.zeros((2, 5), np.float32), mode="a")
    ... except chute.SchemaMismatchError as e:
    ...     print(str(e).split("; ")[-1])
    cannot append float32 records of shape (5,)
    """


class OutBufferError(ChuteError, ValueError, TypeError):
    """An ``out=`` array a gather cannot write into: read-only, not C-contiguous, of a dtype
    that holds Python objects, or of the wrong dtype, shape or size for the batch; the
    message says which. A ValueError and a TypeError, which is what such an array raised
    before, so code catching either keeps working.

    >>> import tempfile, numpy as np, chute
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(6).reshape(3, 2))
    >>> try:
    ...     ds.gather_into([0, 1], np.empty((2, 2), ds.dtype)[:, ::-1])
    ... except chute.OutBufferError as e:
    ...     print(str(e).split(":")[0], isinstance(e, ValueError))
    out is not C-contiguous (a strided view, a transpose or Fortran order) True
    """


class RecordIndexError(ChuteError, IndexError, RuntimeError):
    """A record index outside the dataset. An IndexError, as in numpy; also a RuntimeError,
    which is what loaderx raises for it, so code catching either keeps working.

    >>> import tempfile, numpy as np, chute
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(4))
    >>> try:
    ...     ds[[0, 4]]
    ... except IndexError as e:
    ...     print(type(e).__name__, e)
    RecordIndexError record index 4 is out of range for a dataset of 4 records
    >>> ds.close()
    """


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


class UnsafeFileError(ChuteError, OSError):
    """A file chute was pointed at is not one it will read: its path resolves outside the
    folder it was given (a symlink out), it is not a regular file (a FIFO, a device, a
    folder), or it is larger than its format allows. Nothing of it was read as data.

    >>> import os, tempfile
    >>> import chute
    >>> from chute._util.safe_open import read_regular
    >>> root = tempfile.mkdtemp()
    >>> os.mkfifo(root + "/config.json")
    >>> try:
    ...     read_regular(root + "/config.json", root, limit=1 << 20)
    ... except chute.ChuteError as e:
    ...     print(type(e).__name__, isinstance(e, OSError))
    UnsafeFileError True
    """


class ColumnTypeError(ChuteError, TypeError):
    """A column of a dataset being converted holds rows of different types in different
    blocks (another dtype, another row shape, or fixed rows beside variable-length ones):
    joining them would change values (int64 beside float64 rounds above 2**53), so the
    conversion stops and names the column and both types. A TypeError, as before.

    >>> import numpy as np
    >>> from chute.errors import ColumnTypeError
    >>> from chute.ray._layout import check_column_types
    >>> try:
    ...     check_column_types("ids", [np.array([2**53 + 1]), np.array([0.5])])
    ... except ColumnTypeError as e:
    ...     print(e)
    column 'ids' changes type across blocks: int64 then float64
    """


class SamplerError(ChuteError, ValueError):
    """A sampler object gave the loader positions it cannot use: too many or too few for the
    batch, outside ``[0, length)``, or not integers. Nothing was gathered for that step.

    >>> import numpy as np
    >>> from chute import DataLoader
    >>> from chute.errors import SamplerError
    >>> class OffByOne:
    ...     length, batch_size, step = 10, 2, 0
    ...     def seek(self, step): self.step = step
    ...     def indices(self, step, start=0, stop=None):
    ...         return np.array([9, 10], np.uint64)[start:stop]
    >>> with DataLoader({"x": np.arange(10)}, sampler=OffByOne()) as loader:
    ...     try:
    ...         next(loader)
    ...     except SamplerError as e:
    ...         print(str(e).split(";")[0])
    sampler OffByOne at step 0 gave position 10, outside [0, 10)
    """


class LoaderWorkerError(ChuteError, RuntimeError):
    """A loader's worker process died (a signal, ``os._exit``, the out-of-memory killer)
    while it built a batch: the message names the worker, its process, the step and the
    signal or exit status. The loader stays at that step and starts a new worker for the
    next ``next()``.

    >>> from chute.errors import ChuteError, LoaderWorkerError
    >>> issubclass(LoaderWorkerError, ChuteError), issubclass(LoaderWorkerError, RuntimeError)
    (True, True)
    """


class LoaderTimeoutError(ChuteError, TimeoutError):
    """A loader's batch was not ready within its ``timeout=`` (a gather or the transform did
    not return). The loader stays at that step: the next ``next()`` tries it again.

    >>> import time, numpy as np
    >>> from chute import DataLoader
    >>> from chute.errors import LoaderTimeoutError
    >>> def slow(batch):
    ...     time.sleep(0.5)
    ...     return batch
    >>> with DataLoader({"x": np.arange(10)}, batch_size=2, transform=slow,
    ...                 timeout=0.01) as loader:
    ...     try:
    ...         next(loader)
    ...     except LoaderTimeoutError as e:
    ...         print(isinstance(e, TimeoutError), loader.step)
    True 0
    """


class LoaderInUseError(ChuteError, RuntimeError):
    """A loader already feeding a device stage (`chute.frameworks.to_device`) was given to
    another one: the two would split its batches between them. Close the first stage, or
    keep using it.

    >>> import numpy as np
    >>> from chute import DataLoader
    >>> from chute.errors import LoaderInUseError
    >>> from chute.frameworks import to_device
    >>> loader = DataLoader({"x": np.arange(10)}, batch_size=2)
    >>> with to_device(loader, "cpu") as first:
    ...     try:
    ...         to_device(loader, "cpu")
    ...     except LoaderInUseError as e:
    ...         print(type(e).__name__)
    LoaderInUseError
    """


class StateMismatchError(ChuteError, ValueError):
    """A saved state (``state_dict()``) that the object loading it cannot resume from: not a
    state of its kind or of a version it reads, or saved under another configuration (seed,
    batch size, sampler, data ...). ``differences`` maps each differing field to its saved
    and current value; nothing was moved.

    >>> import numpy as np
    >>> from chute import DataLoader
    >>> from chute.errors import StateMismatchError
    >>> with DataLoader({"x": np.arange(10)}, batch_size=2, seed=1) as loader:
    ...     state = loader.state_dict()
    >>> with DataLoader({"x": np.arange(10)}, batch_size=2, seed=2) as loader:
    ...     try:
    ...         loader.load_state_dict(state)
    ...     except StateMismatchError as e:
    ...         print(e.differences)
    {'seed': (1, 2)}
    """

    def __init__(
        self, message: str, differences: dict[str, tuple[object, object]] | None = None
    ) -> None:
        super().__init__(message)
        self.differences = {} if differences is None else differences


class RemoteError(ChuteError, OSError):
    """A request to object storage (or a web server) failed for good: denied, throttled or
    dropped after the bounded retries, or answered with something other than what was asked.
    The message names the URL (and the record, for a read); nothing wrong was returned.

    >>> from chute.errors import RemoteError
    >>> err = RemoteError("s3://bucket/d/chunk-00000.zr: 403 Forbidden (record 7)")
    >>> isinstance(err, OSError), "record 7" in str(err)
    (True, True)
    """


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """An object a dataset needs is not at its URL (a dataset not there, or a file of it
    missing).

    >>> from chute.errors import RemoteNotFoundError
    >>> isinstance(RemoteNotFoundError("s3://bucket/d/meta.zr"), FileNotFoundError)
    True
    """


class RemoteChangedError(RemoteError, StoreChangedError):
    """An object changed since the dataset was opened (its ETag or size differs from the one
    read at open): its bytes now may not match the table read then, so they are not used.
    Reopen the dataset to read the new version.

    >>> from chute.errors import RemoteChangedError, StoreChangedError
    >>> isinstance(RemoteChangedError("s3://b/d/chunk-00000.zr changed"), StoreChangedError)
    True
    """


class CacheTooSmallError(ChuteError, ValueError):
    """A local cache whose ``cache_bytes`` cannot hold what one batch needs at once: it would
    evict blocks the batch still needs (or wait for ever). Raised at open, naming both sizes.

    >>> from chute.errors import CacheTooSmallError
    >>> isinstance(CacheTooSmallError("cache_bytes=1024 ..."), ValueError)
    True
    """
