"""Errors of the step loader: samplers, worker threads and processes, saved states."""

from __future__ import annotations

from chute.errors._base import ChuteError


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
