"""Index sampler of the step loader: the batch at step s is a pure function of (seed, s)."""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from chute._native import fill as _fill

__all__ = ["Sampler", "SamplerMode"]

SamplerMode = Literal["sequential", "iid", "cyclic"]
"""How a batch is drawn from ``[0, length)``."""

_MODES: dict[str, int] = {"sequential": 0, "iid": 1, "cyclic": 2}
_U64 = 1 << 64


def _check_u64(name: str, value: int, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if not minimum <= value < _U64:
        raise ValueError(f"{name} must be in [{minimum}, 2**64), got {value}")
    return value


class Sampler:
    """Draws a batch of indices in ``[0, length)`` for any training step, in O(batch).

    Modes:
      - ``"sequential"``: a sliding window over the index space read as a circular queue.
      - ``"iid"``: uniform with replacement, unbiased (Lemire's method with rejection).
      - ``"cyclic"``: without replacement; each cycle of ``length // batch_size`` steps is a
        fresh permutation of the whole space (a keyed Feistel network with cycle-walking, so no
        O(length) memory). Every batch is full; the cycle's remainder is dropped, and differs
        from cycle to cycle because the permutation does.

    Nothing depends on earlier draws, so ``indices(step)`` and ``seek(step)`` cost the same for
    step 10 and step 10**12. The sampler is also an endless iterator starting at ``step``.
    """

    __slots__ = ("_code", "_step", "batch_size", "length", "mode", "seed")

    def __init__(
        self, length: int, batch_size: int, mode: SamplerMode = "cyclic", seed: int = 0
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {get_args(SamplerMode)}, got {mode!r}")
        self.length = _check_u64("length", length)
        self.batch_size = _check_u64("batch_size", batch_size)
        if self.length == 0:
            raise ValueError("length must be positive: the index space is empty")
        if self.batch_size == 0:
            raise ValueError("batch_size must be positive")
        if mode == "cyclic" and self.batch_size > self.length:
            raise ValueError(
                f"a cyclic batch of {self.batch_size} cannot be drawn without replacement "
                f"from {self.length} indices; use mode='iid' or a smaller batch"
            )
        self.mode: SamplerMode = mode
        self.seed = _check_u64("seed", seed)
        self._code = _MODES[mode]
        self._step = 0

    @property
    def step(self) -> int:
        """The step whose batch ``next()`` returns."""
        return self._step

    @property
    def steps_per_cycle(self) -> int | None:
        """Steps in one permutation (cyclic mode), or None for the modes without cycles."""
        return self.length // self.batch_size if self._code == 2 else None

    def seek(self, step: int) -> None:
        """Make ``step`` the next step to draw; O(1) in every mode."""
        self._step = _check_u64("step", step)

    def indices(self, step: int, start: int = 0, stop: int | None = None) -> npt.NDArray[np.uint64]:
        """Positions ``start:stop`` of the batch at ``step`` (all of it by default).

        A slice costs only its own length, which is how each host of a multi-host run draws
        just its share of the global batch.
        """
        end = self.batch_size if stop is None else stop
        if not 0 <= start <= end <= self.batch_size:
            raise ValueError(f"slice {start}:{end} is outside a batch of {self.batch_size}")
        out = np.empty(end - start, dtype=np.uint64)
        _fill(self._code, self.length, self.batch_size, self.seed, step, start, out)
        return out

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> npt.NDArray[np.uint64]:
        batch = self.indices(self._step)
        self._step += 1
        return batch

    def __repr__(self) -> str:
        return (
            f"Sampler(length={self.length}, batch_size={self.batch_size}, "
            f"mode={self.mode!r}, seed={self.seed}, step={self._step})"
        )
