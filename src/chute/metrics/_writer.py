"""What the three writers share: step bookkeeping, batch validation, config, finishing."""

from __future__ import annotations

import operator
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from chute.errors import MetricValueError, MetricWrittenTwiceError, StepOrderError

from . import _config
from . import _format as F
from ._columns import Column
from ._dtypes import Value, capture, check_f32, new_value, resolve

_F32_MAX = float(np.finfo(np.float32).max)


def check_step(step: object) -> int:
    """A step as a Python int in the uint32 range (NumPy integers accepted)."""
    if isinstance(step, bool):
        raise TypeError("step must be an integer, not a bool")
    try:
        value = operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"step must be an integer, got {type(step).__name__}") from None
    if not 0 <= value <= F.MAX_STEP:
        raise ValueError(f"step {value} is outside the uint32 range [0, {F.MAX_STEP}]")
    return value


def batch_of(metrics: object, kwargs: dict[str, Any]) -> Mapping[str, Any]:
    """The `write()` arguments as one mapping: a dict or keywords, not both."""
    if metrics is None:
        return kwargs
    if kwargs:
        raise TypeError("write() takes one dict or keyword metrics, not both")
    if not isinstance(metrics, Mapping):
        raise TypeError(f"write() takes a dict of metrics, got {type(metrics).__name__}")
    return metrics


def check_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated `config_overrides` for `finish()`."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise TypeError("config_overrides must be a dict")
    _config.freeze(overrides)
    return dict(overrides)


@dataclass(slots=True)
class _Meta:
    code: str
    lo: int = 0
    hi: int = 0
    last_step: int = -1


#: The float kinds a batch may repeat in (see `_Repeat`): (the column code, explicit).
_FLOAT_KINDS: dict[type, tuple[str, bool]] = {
    float: ("f64", False),
    np.float64: ("f64", True),
    np.float32: ("f32", True),
}


@dataclass(slots=True)
class _Repeat:
    """The last batch committed, when its values were all of one float kind stored as is
    (`_FLOAT_KINDS`): the same names at a later step, of the same kind, need no check of
    their own (a training loop's `write()` of the same scalars every step)."""

    names: tuple[str, ...]
    kind: type
    metas: list[_Meta]
    step: int


@dataclass(slots=True)
class Schema:
    """The writer's view of every metric's dtype; `validate` checks a batch without changing it."""

    root: str
    metas: dict[str, _Meta] = field(default_factory=dict)
    names: F.NameSpace = field(default_factory=F.NameSpace)
    _repeat: _Repeat | None = None
    _fast: list[tuple[str, Value, str]] | None = None  # what `validate` last passed as a repeat

    @classmethod
    def of(cls, root: str, cols: Mapping[str, Column]) -> Schema:
        metas = {n: _Meta(c.code, c.lo, c.hi, c.last_step) for n, c in cols.items()}
        return cls(root, metas, F.NameSpace(cols))

    def validate(self, batch: Mapping[str, Any], step: int) -> list[tuple[str, Value, str]]:
        if step > F.MAX_STEP:
            raise ValueError(f"step {step} is past the last uint32 step; finish the run")
        rep = self._repeat
        if rep is not None and step > rep.step and tuple(batch) == rep.names:
            vals = list(batch.values())
            if set(map(type, vals)) == {rep.kind}:
                code, explicit = _FLOAT_KINDS[rep.kind]
                nums = map(float, vals)
                items = zip(repeat(code), nums, repeat(None), repeat(explicit))
                self._fast = list(zip(rep.names, map(new_value, items), repeat(code)))
                return self._fast
        out: list[tuple[str, Value, str]] = []
        metas = self.metas
        new: F.NameSpace | None = None  # the batch's new names, checked against each other too
        for name, value in batch.items():
            meta = metas.get(name)
            # Fast paths: a plain float joining a float column it fits (NaN/inf take the slow
            # one), and a NumPy float joining a column of its own dtype.
            if meta is not None and meta.last_step != step:
                kind, code = type(value), meta.code
                if kind is float and (
                    code == "f64" or (code == "f32" and -_F32_MAX <= value <= _F32_MAX)  # type: ignore[operator]
                ):
                    out.append((name, new_value(("f64", value, None, False)), code))  # type: ignore[arg-type]
                    continue
                if (kind is np.float32 and code == "f32") or (kind is np.float64 and code == "f64"):
                    out.append((name, new_value((code, float(value), None, True)), code))  # type: ignore[arg-type]
                    continue
            if meta is None:
                new = self._check_new(name, new)
            elif meta.last_step == step:
                raise MetricWrittenTwiceError(f"metric {name!r} was already written at step {step}")
            try:
                val = capture(value)
                if meta is None:
                    code = resolve(None, val)
                elif val.code == meta.code:  # the common case: nothing to widen
                    code = meta.code
                    if code == "f32" and not val.explicit:
                        check_f32(val.num)
                else:
                    code = resolve(meta.code, val, meta.lo, meta.hi)
            except (TypeError, ValueError, OverflowError) as e:
                raise MetricValueError(f"metric {name!r} at step {step}: {e}") from None
            out.append((name, val, code))
        return out

    def _check_new(self, name: object, new: F.NameSpace | None) -> F.NameSpace:
        """A metric's first name: the format's rules, the filesystem's limits, and no clash
        with the run's other names (a folder of one the file of another)."""
        F.check_name(name, self.root)
        assert isinstance(name, str)
        new = new if new is not None else F.NameSpace()
        problem = self.names.clash(name, new)
        if problem is not None:
            raise ValueError(f"{problem}; the filesystem cannot hold both")
        new.add(name)
        return new

    def move_step(self, current: int, value: object) -> int:
        """Validate `writer.step = value`: forward only, and not while a step is half written.

        Plättli lets the step go back and then writes steps out of order (or fails at
        `finish`); here going back over written steps is refused up front.
        """
        new = check_step(value)
        if new == current:
            return new
        last = max((m.last_step for m in self.metas.values()), default=-1)
        if last == current:
            raise StepOrderError(
                f"step {current} has writes not ended yet; call end_step() before moving the step"
            )
        if new <= last:
            raise StepOrderError(
                f"cannot move the step back to {new}: step {last} is already written; "
                f"to rewrite from step {new}, reopen the writer with step={new}"
            )
        return new

    def commit(self, checked: list[tuple[str, Value, str]], step: int) -> None:
        rep = self._repeat
        if checked is self._fast and rep is not None:
            self._fast = None
            for known in rep.metas:
                known.last_step = step
            rep.step = step
            return
        self._fast = None
        metas = self.metas
        kinds: set[tuple[str, bool]] = set()
        for name, val, code in checked:
            meta = metas.get(name)
            num = val.num
            if meta is None:
                meta = metas[name] = _Meta(code)
                self.names.add(name)
                if type(num) is int:
                    meta.lo = meta.hi = num
            else:
                meta.code = code
                if type(num) is int:
                    if num < meta.lo:
                        meta.lo = num
                    elif num > meta.hi:
                        meta.hi = num
            meta.last_step = step
            kinds.add(
                (code, val.explicit) if type(num) is float and val.code == code else ("", False)
            )
        kind = next((k for k, v in _FLOAT_KINDS.items() if {v} == kinds), None)
        self._repeat = (
            _Repeat(tuple(n for n, _, _ in checked), kind, [metas[n] for n, _, _ in checked], step)
            if kind is not None
            else None
        )


class Steps(ABC):
    """What every metric writer shares: the step it logs at, and each batch validated as a
    whole, then committed to the run's schema at that step."""

    _step: int
    _schema: Schema

    @abstractmethod
    def _check_open(self) -> None:
        """Raise `WriterClosedError` once the writer is finished or closed."""

    @property
    def step(self) -> int:
        """The step that `write()` logs at; assign to jump ahead (never back over written steps)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._check_open()
        self._step = self._schema.move_step(self._step, value)

    def _accept(
        self, metrics: Mapping[str, Any] | None, kwargs: dict[str, Any]
    ) -> list[tuple[str, Value, str]]:
        """The batch of a `write()` call, checked and committed (nothing changes on an error)."""
        self._check_open()
        checked = self._schema.validate(batch_of(metrics, kwargs), self._step)
        self._schema.commit(checked, self._step)
        return checked


def run_paths(outdir: str | os.PathLike[str]) -> tuple[str, str, str]:
    """(outdir, its plattli/ folder, its metrics.plattli archive)."""
    out = os.fspath(outdir)
    return out, os.path.join(out, F.DIR_NAME), os.path.join(out, F.ZIP_NAME)
