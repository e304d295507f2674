"""Index samplers of the step loader: the batch at step s is a pure function of (seed, s).

`Sampler` draws in three built-in modes, `WeightedSampler` draws with a probability per
index, and `StepSampler` is the base a custom sampler (class-balanced, curriculum ...) fills
in. The loader accepts any object with the `SamplerLike` protocol.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np
import numpy.typing as npt

from chute._native import fill as _fill
from chute._native import sampler_codes
from chute._util.checks import check_int
from chute._util.renamed import legacy_arguments
from chute._util.state import StateLayout, check_state, make_state

__all__ = [
    "OrderSampler",
    "Sampler",
    "SamplerLike",
    "SamplerMode",
    "StepSampler",
    "WeightedSampler",
    "lane_order",
]

SamplerMode = Literal["sequential", "iid", "cyclic"]
"""How a batch is drawn from ``[0, length)``."""

_MODES: dict[SamplerMode, int] = {"sequential": 0, "iid": 1, "cyclic": 2}
"""Each mode's code: loaderx's integer modes, and the compiled sampler's (checked below)."""
_MODE_NAMES: dict[int, SamplerMode] = {code: name for name, code in _MODES.items()}
_COMPILED = {
    "sequential": sampler_codes.MODE_SEQUENTIAL,
    "iid": sampler_codes.MODE_IID,
    "cyclic": sampler_codes.MODE_CYCLIC,
}
if _COMPILED != _MODES:
    raise ImportError(f"chute's compiled sampler has mode codes {_COMPILED}, not {_MODES}")
_U64 = 1 << 64
_UNIT_BITS = 53  # uniform doubles in [0, 1) carry 53 random bits
_WEIGHTED_DOMAIN = 0x5765696768746564  # keeps weighted draws apart from iid draws of a seed
_LANES_DOMAIN = 0x4C616E65734F7264  # and the group order of lanes from cyclic draws


def _check_u64(name: str, value: int, minimum: int = 0, end: int = _U64) -> int:
    """``value`` as an int in ``[minimum, end)``, ``end`` being 2**64 or just below it (the
    loader's last step); bool refused, numpy integers taken."""
    return check_int(name, value, minimum=minimum, maximum=end - 1)


def mode_from_code(code: object, argument: str, stacklevel: int = 3) -> SamplerMode:
    """loaderx's integer mode (0/1/2) as chute's mode name, with a DeprecationWarning."""
    if isinstance(code, bool) or not isinstance(code, (int, np.integer)) or code not in _MODE_NAMES:
        raise ValueError(
            f"{argument}={code!r}: loaderx's mode codes are 0, 1 and 2; chute names them "
            f"sampler='sequential', 'iid' or 'cyclic'"
        )
    name = _MODE_NAMES[int(code)]
    warnings.warn(
        f"{argument}={int(code)} is loaderx's mode code; chute spells it sampler={name!r}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return name


@runtime_checkable
class SamplerLike(Protocol):
    """What `DataLoader(sampler=...)` accepts: positions in ``[0, length)`` for any step.

    ``indices(step, start, stop)`` must be a pure function of the sampler's configuration and
    ``step`` (that is what makes resume exact and the stream independent of threads), and
    return positions ``start:stop`` of the batch as a uint64 array. ``step`` and ``seek`` move
    the sampler. An optional ``fingerprint()`` (a JSON-able value) goes into the loader's
    state, so a resume with a different configuration is refused.

    Any object with these members will do; it need not derive from anything:

    >>> import numpy as np
    >>> from chute import DataLoader
    >>> class HardExamples:  # always the same two records
    ...     length, batch_size, step = 10, 2, 0
    ...     def seek(self, step): self.step = step
    ...     def indices(self, step, start=0, stop=None):
    ...         return np.array([7, 3], np.uint64)[start:stop]
    >>> with DataLoader({"x": np.arange(10) * 10}, sampler=HardExamples()) as loader:
    ...     next(loader)["x"].tolist(), loader.step
    ([70, 30], 1)
    """

    @property
    def length(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def step(self) -> int: ...

    def seek(self, step: int) -> None: ...

    def indices(
        self, step: int, start: int = 0, stop: int | None = None
    ) -> npt.NDArray[np.uint64]: ...


def sampler_config(sampler: SamplerLike) -> dict[str, Any]:
    """The configuration of ``sampler`` that a saved state compares: its seed (None if it
    has none), its ``fingerprint()`` (else its class name) and its batch size."""
    return {
        "seed": getattr(sampler, "seed", None),
        "sampler": (
            sampler.fingerprint() if hasattr(sampler, "fingerprint") else type(sampler).__qualname__
        ),
        "batch_size": sampler.batch_size,
    }


class StepSampler(ABC):
    """Base of a sampler whose batch at a step depends on nothing but the step.

    A subclass implements `fill` (write positions ``start:start + len(out)`` of the batch at
    ``step`` into ``out``); slicing, seeking and iteration come from here. The sampler is an
    endless iterator starting at `step`.

    >>> import numpy as np
    >>> class Backwards(StepSampler):  # a sliding window from the end
    ...     def fill(self, step, start, out):
    ...         first = step * self.batch_size + start
    ...         out[:] = (self.length - 1 - first - np.arange(len(out))) % self.length
    >>> s = Backwards(length=5, batch_size=2)
    >>> next(s).tolist(), next(s).tolist(), s.step
    ([4, 3], [2, 1], 2)
    >>> s.indices(2).tolist(), s.indices(2, start=1).tolist()  # any step, any slice
    ([0, 4], [4])
    >>> state = s.state_dict()  # JSON-able: the step, seed, fingerprint, batch size, length
    >>> t = Backwards(length=5, batch_size=2)
    >>> t.load_state_dict(state)  # refused if the configuration differs
    >>> t.step, next(t).tolist()
    (2, [0, 4])
    """

    _STATE = StateLayout("StepSampler", (1,), ("step",))

    length: int
    batch_size: int
    seed: int

    @legacy_arguments(positional=("seed",))
    def __init__(self, length: int, batch_size: int, *, seed: int = 0) -> None:
        self.length = _check_u64("length", length, minimum=1)
        self.batch_size = _check_u64("batch_size", batch_size, minimum=1)
        self.seed = _check_u64("seed", seed)
        self._step = 0

    @abstractmethod
    def fill(self, step: int, start: int, out: npt.NDArray[np.uint64]) -> None:
        """Write positions ``start:start + len(out)`` of the batch at ``step`` into ``out``."""

    def fingerprint(self) -> Any:
        """A JSON-able summary of the configuration, compared on resume."""
        return type(self).__qualname__

    @property
    def step(self) -> int:
        """The step whose batch ``next()`` returns."""
        return self._step

    def seek(self, step: int) -> None:
        """Make ``step`` the next step to draw; O(1), nothing is replayed."""
        self._step = _check_u64("step", step)

    def indices(self, step: int, start: int = 0, stop: int | None = None) -> npt.NDArray[np.uint64]:
        """Positions ``start:stop`` of the batch at ``step`` (all of it by default).

        A slice costs only its own length, which is how each host of a multi-host run draws
        just its share of the global batch.
        """
        step = _check_u64("step", step)
        end = self.batch_size if stop is None else stop
        if not 0 <= start <= end <= self.batch_size:
            raise ValueError(f"slice {start}:{end} is outside a batch of {self.batch_size}")
        out = np.empty(end - start, dtype=np.uint64)
        self.fill(step, start, out)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands (``step``) and its configuration (seed, `fingerprint`,
        batch size, length); JSON-able."""
        return make_state(self._STATE, self._config(), step=self._step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the state's step; a state of another configuration is refused
        (`chute.errors.StateMismatchError`, naming each differing field)."""
        checked = check_state(state, self._STATE, self._config())
        self.seek(_check_u64("the saved step", checked["step"]))

    def _config(self) -> dict[str, Any]:
        return {**sampler_config(self), "length": self.length}

    def __iter__(self) -> StepSampler:
        return self

    def __next__(self) -> npt.NDArray[np.uint64]:
        batch = self.indices(self._step)
        self._step += 1
        return batch


class Sampler(StepSampler):
    """Draws a batch of indices in ``[0, length)`` for any training step, in O(batch).

    Modes:
      - ``"sequential"``: a sliding window over the index space read as a circular queue.
      - ``"iid"``: uniform with replacement, unbiased (Lemire's method with rejection).
      - ``"cyclic"``: without replacement; each cycle of ``length // batch_size`` steps is a
        fresh permutation of the whole space (a keyed Feistel network with cycle-walking, so no
        O(length) memory). Every batch is full; the cycle's remainder is dropped, and differs
        from cycle to cycle because the permutation does.

    Nothing depends on earlier draws, so ``indices(step)`` and ``seek(step)`` cost the same for
    step 10 and step 10**12.

    >>> s = Sampler(10, 4, "sequential")
    >>> s.indices(2).tolist()
    [8, 9, 0, 1]
    """

    def __init__(
        self, length: int, batch_size: int, mode: SamplerMode = "cyclic", seed: int = 0
    ) -> None:
        if not isinstance(mode, str):
            mode = mode_from_code(mode, "mode")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {get_args(SamplerMode)}, got {mode!r}")
        super().__init__(length, batch_size, seed=seed)
        if mode == "cyclic" and self.batch_size > self.length:
            raise ValueError(
                f"a cyclic batch of {self.batch_size} cannot be drawn without replacement "
                f"from {self.length} indices; draw with replacement (sampler='iid') or use "
                "a smaller batch"
            )
        self.mode: SamplerMode = mode
        self._code = _MODES[mode]

    @property
    def steps_per_cycle(self) -> int | None:
        """Steps in one permutation (cyclic mode), or None for the modes without cycles."""
        return self.length // self.batch_size if self._code == 2 else None

    def fill(self, step: int, start: int, out: npt.NDArray[np.uint64]) -> None:
        _fill(self._code, self.length, self.batch_size, self.seed, step, start, out)

    def fingerprint(self) -> Any:
        return self.mode

    def __repr__(self) -> str:
        return (
            f"Sampler(length={self.length}, batch_size={self.batch_size}, "
            f"mode={self.mode!r}, seed={self.seed}, step={self._step})"
        )


class WeightedSampler(StepSampler):
    """Draws index i with probability ``weights[i] / sum(weights)``, with replacement.

    Each draw is one counter-based uniform number (keyed by seed, step and position, from the
    same generator as ``"iid"``) mapped through the cumulative weights by binary search, so a
    batch costs O(batch * log(length)) and ``seek`` is O(1) as in every mode. An index of
    weight 0 is never drawn. Class balancing is a weight per index:
    ``weights = 1 / class_counts[labels]``.

    >>> s = WeightedSampler([0.0, 1.0, 0.0, 3.0], batch_size=8, seed=1)
    >>> sorted(set(s.indices(0).tolist())) in ([1, 3], [3])
    True
    """

    @legacy_arguments(positional=("seed",))
    def __init__(self, weights: npt.ArrayLike, batch_size: int, *, seed: int = 0) -> None:
        w = np.asarray(weights)
        if w.ndim != 1 or w.size == 0 or w.dtype.kind not in "iuf" or w.dtype == np.bool_:
            raise ValueError(f"weights must be a non-empty 1-D array of numbers, got {w.dtype}")
        super().__init__(w.size, batch_size, seed=seed)
        self._cdf, self._digest = _cumulative(w)
        self._total = float(self._cdf[-1])
        # the last index whose weight counts: a rounding that lands on the total picks it,
        # never a zero weight after it
        self._last = int(np.searchsorted(self._cdf, self._total, side="left"))
        self._key = (self.seed ^ _WEIGHTED_DOMAIN) % _U64

    @property
    def probabilities(self) -> npt.NDArray[np.float64]:
        """Each index's probability per draw."""
        return np.diff(self._cdf, prepend=0.0) / self._total

    def fill(self, step: int, start: int, out: npt.NDArray[np.uint64]) -> None:
        bits = np.empty(len(out), np.uint64)
        _fill(_MODES["iid"], 1 << _UNIT_BITS, self.batch_size, self._key, step, start, bits)
        target = bits.astype(np.float64) * (self._total / (1 << _UNIT_BITS))
        picks = np.searchsorted(self._cdf, target, side="right")
        np.minimum(picks, self._last, out=picks)
        out[:] = picks

    def fingerprint(self) -> Any:
        return {"kind": "weighted", "length": self.length, "weights": self._digest}

    def __repr__(self) -> str:
        return (
            f"WeightedSampler(length={self.length}, batch_size={self.batch_size}, "
            f"seed={self.seed}, weights={self._digest}, step={self._step})"
        )


class DrawBlocks:
    """The run's draws made ``size`` at a time and the last ``kept`` blocks kept, for
    samplers whose draws cost about as much for one step as for a hundred (an order
    computed in Python: a mixture's routing, a stream's lanes): `fill` copies a step's
    slice out of its block. Loader threads building neighbouring steps share the blocks."""

    def __init__(
        self, draw: Callable[[int, int], npt.NDArray[np.uint64]], size: int = 1 << 13,
        kept: int = 8,
    ) -> None:  # fmt: skip
        self._draw, self._size, self._kept = draw, size, kept
        self._lock = threading.Lock()
        self._blocks: OrderedDict[int, npt.NDArray[np.uint64]] = OrderedDict()
        self._last: tuple[int, npt.NDArray[np.uint64] | None] = (-1, None)  # read unlocked

    def fill(self, first: int, out: npt.NDArray[np.uint64]) -> None:
        """Draws ``first .. first + len(out) - 1`` into ``out``."""
        block, at = divmod(first, self._size)
        last, drawn = self._last
        if last == block and drawn is not None and at + out.size <= self._size:
            out[:] = drawn[at : at + out.size]
            return
        while out.size:  # a step's draws may straddle two blocks
            take = min(out.size, self._size - at)
            out[:take] = self._block(block)[at : at + take]
            out, block, at = out[take:], block + 1, 0

    def _block(self, block: int) -> npt.NDArray[np.uint64]:
        with self._lock:
            found = self._blocks.get(block)
        if found is None:
            found = self._draw(block * self._size, self._size)  # outside the lock
            with self._lock:
                self._blocks[block] = found
                while len(self._blocks) > self._kept:
                    self._blocks.popitem(last=False)
        self._last = (block, found)
        return found


class OrderSampler(StepSampler):
    """Draws a stream in its own order (`chute.loader._streams.Ordered`): the batch at step
    s is the stream's draws ``s * batch_size ...`` of the run keyed by ``seed``."""

    def __init__(self, stream: Any, batch_size: int, *, seed: int = 0) -> None:
        super().__init__(len(stream), batch_size, seed=seed)
        if self.batch_size > self.length:  # a pass could not fill one batch
            raise ValueError(
                f"a batch of {self.batch_size} is more than the {self.length} records of a "
                "pass of this stream's order; use a smaller batch (or sampler='iid')"
            )
        self.stream = stream
        self._blocks = DrawBlocks(functools.partial(stream.order, self.seed))

    def fill(self, step: int, start: int, out: npt.NDArray[np.uint64]) -> None:
        self._blocks.fill(step * self.batch_size + start, out)

    def fingerprint(self) -> Any:
        own = getattr(self.stream, "fingerprint", None)
        return {"kind": "order", "stream": own() if own else type(self.stream).__qualname__}

    def __repr__(self) -> str:
        return (
            f"OrderSampler({self.stream!r}, batch_size={self.batch_size}, seed={self.seed}, "
            f"step={self._step})"
        )


def lane_order(
    groups: int, per_group: int, tail: int, lanes: int, seed: int, first: int, n: int
) -> npt.NDArray[np.uint64]:
    """Draws ``first .. first + n - 1`` of records laid out as ``groups`` groups of
    ``per_group`` (record ``g * per_group + b``) and ``tail`` records after them.

    Each pass takes the groups in a fresh order (keyed by ``seed`` and the pass), ``lanes``
    at a time, and reads those side by side: draw j of a block of lanes is record
    ``j // lanes`` of its ``j % lanes``-th group. Consecutive draws then come from different
    groups, and a group's records are all drawn within ``lanes * per_group`` draws, so a
    cache of a block's groups serves every draw. The ``tail`` records end each pass.

    >>> lane_order(groups=3, per_group=2, tail=1, lanes=2, seed=0, first=0, n=7).tolist()
    [2, 0, 3, 1, 4, 5, 6]
    """
    total = groups * per_group + tail
    out = np.empty(n, np.uint64)
    done = 0
    key = (seed ^ _LANES_DOMAIN) % _U64
    while done < n:
        cycle, pos = divmod(first + done, total)
        if pos >= groups * per_group:  # the tail, in order
            take = min(n - done, total - pos)
            out[done : done + take] = np.arange(pos, pos + take, dtype=np.uint64)
            done += take
            continue
        block, j0 = divmod(pos, lanes * per_group)
        width = min(lanes, groups - block * lanes)
        take = min(n - done, width * per_group - j0)
        order = np.empty(width, np.uint64)
        _fill(_MODES["cyclic"], groups, groups, key, cycle % _U64, block * lanes, order)
        j = np.arange(j0, j0 + take, dtype=np.uint64)
        lane, step = np.divmod(j, np.uint64(width))[::-1]
        out[done : done + take] = order[lane] * np.uint64(per_group) + step
        done += take
    return out


_CHUNK = 1 << 18  # weights converted at a time: bounds the temporaries, whatever the length


def _cumulative(w: npt.NDArray[Any]) -> tuple[npt.NDArray[np.float64], str]:
    """The cumulative weights, scaled by the power of two that puts the largest weight in
    [0.5, 1), and the digest of the weights as float64.

    Scaling by a power of two is exact, so the draws are those of the weights as given, yet
    no sum can overflow (1e308 each) or lose every bit to underflow (subnormal weights). The
    float64 array is the only allocation of the weights' length; the rest goes chunk by chunk.
    """
    cdf = np.empty(w.size, np.float64)
    digest = hashlib.blake2b(digest_size=8)
    top = 0.0
    with np.errstate(over="ignore"):  # a longdouble past float64's range becomes inf: refused
        for start in range(0, w.size, _CHUNK):
            part = cdf[start : start + _CHUNK]
            part[...] = w[start : start + _CHUNK]
            if not np.isfinite(part).all() or (part < 0).any():
                raise ValueError("weights must be finite and non-negative")
            digest.update(part.data)
            top = max(top, float(part.max()))
    if top == 0:
        raise ValueError("weights sum to 0: no index can be drawn")
    shift = -int(np.frexp(top)[1])
    total = 0.0
    for start in range(0, w.size, _CHUNK):
        part = cdf[start : start + _CHUNK]
        np.ldexp(part, shift, out=part)
        part[0] += total  # carried in first, so each sum is the one a single pass makes
        np.cumsum(part, out=part)
        total = float(part[-1])
    return cdf, digest.hexdigest()
