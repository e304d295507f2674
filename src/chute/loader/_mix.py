"""Weighted mixtures of streams (`chute.mix`): one stream whose every batch holds each source
in proportion to its weight, at every prefix of the run.

How records are shared out. The weights are scaled to integers summing to 2**32 and the
sources arranged as the leaves of a balanced binary tree. A node that has received ``J``
records gives ``floor((a * J + d // 2) / d)`` of them to its left subtree (``a`` and ``d``
the left subtree's and the node's weight) and the rest to its right. Each count is a
closed-form, non-decreasing function of ``J``, so:

* after any number of records every source holds its weight's share to within one record
  per level of the tree (``ceil(log2(sources))``), at every step, not only on average;
* the records a source has had before step ``t`` are known in O(sources) without replaying
  the run, so a loader seeks, resumes and slices (``shard=``) a mixture as any stream;
* which source record ``J`` goes to is decided by ``J`` alone, so every process of a
  multi-host run computes the same global batch and takes its slice of it.

A weight schedule (``schedule={step: weights}``) starts a new phase at each step given;
each phase shares out its own records, the counts of the phases before it carried over.

Each source keeps its own order: its n-th record drawn is position n of its own sampler
(a fresh permutation each cycle through it, for ``"cyclic"``), keyed by the loader's seed
and the source's name, so a small source cycles many times while a large one is still in
its first pass, and adding a source does not reorder the others.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._native import fill as _fill
from chute._native import sampler_codes
from chute._util.checks import check_int
from chute.datasets._tokens import positions_of
from chute.loader._sampler import DrawBlocks, SamplerMode, StepSampler
from chute.loader._streams import Ordered, Stream, as_streams, check_streams
from chute.loader._tokens import TokenWindows

__all__ = ["MixSampler", "Mixture", "mix"]

_SCALE = 1 << 32  # the weights of a phase, as integers summing to this
_IID_BLOCK = 1 << 32  # iid draws of a source: draw n is position n % block of step n // block
_SOURCE = "source"


def _integer_weights(weights: Any, names: Sequence[str], where: str) -> tuple[int, ...]:
    """``weights`` (a mapping by source name, or a sequence in the sources' order) as
    integers summing to 2**32, by largest remainder."""
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        missing = [n for n in names if n not in weights]
        if unknown or missing:
            raise ValueError(
                f"{where}: weights name {unknown or 'no unknown source'} and leave out "
                f"{missing or 'none'}; give one weight per source, {list(names)}"
            )
        values = [weights[n] for n in names]
    elif isinstance(weights, (Sequence, np.ndarray)) and not isinstance(weights, (str, bytes)):
        values = list(weights)
        if len(values) != len(names):
            raise ValueError(f"{where}: {len(values)} weights for {len(names)} sources")
    else:
        raise TypeError(
            f"{where}: give weights as a mapping by source name or a list in the sources' "
            f"order, not a {type(weights).__name__}"
        )
    if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in values):
        raise TypeError(f"{where}: weights must be numbers, got {values!r}")
    w = np.asarray(values, np.float64)
    if not np.isfinite(w).all() or (w < 0).any() or not w.any():
        raise ValueError(f"{where}: weights must be finite, non-negative and not all 0")
    w = w / w.max()  # any scale: a sum of weights near the float limit would overflow
    exact = w / w.sum() * _SCALE
    base = np.floor(exact).astype(np.int64)
    short = _SCALE - int(base.sum())
    order = np.lexsort((np.arange(w.size), -(exact - base)))  # largest remainders first
    base[order[:short]] += 1
    return tuple(int(x) for x in base)


@dataclass(frozen=True)
class _Node:
    lo: int
    hi: int
    left: _Node | None
    right: _Node | None


def _tree(lo: int, hi: int) -> _Node:
    if hi - lo == 1:
        return _Node(lo, hi, None, None)
    mid = (lo + hi) // 2
    return _Node(lo, hi, _tree(lo, mid), _tree(mid, hi))


def _left_share(a: int, d: int, j: int) -> int:
    """Of ``j`` records at a node of weight ``d``, those of its left subtree (weight ``a``)."""
    return (a * j + d // 2) // d if d else 0


class _Phase:
    """The records of one phase, shared out by one set of integer weights."""

    def __init__(self, weights: tuple[int, ...]) -> None:
        self.weights = weights
        self.prefix = np.concatenate([[0], np.cumsum(weights)]).tolist()
        self.root = _tree(0, len(weights))

    def _w(self, node: _Node) -> int:
        return int(self.prefix[node.hi] - self.prefix[node.lo])

    def counts(self, j: int) -> list[int]:
        """Records of each source among the phase's first ``j``."""
        out = [0] * len(self.weights)
        stack = [(self.root, j)]
        while stack:
            node, n = stack.pop()
            if node.left is None or node.right is None:
                out[node.lo] = n
                continue
            k = _left_share(self._w(node.left), self._w(node), n)
            stack.append((node.left, k))
            stack.append((node.right, n - k))
        return out

    def route(self, j0: int, n: int) -> npt.NDArray[np.int64]:
        """The source of each of the phase's records ``j0 .. j0 + n - 1``."""
        source = np.empty(n, np.int64)
        stack = [(self.root, j0, np.arange(n, dtype=np.int64))]
        while stack:
            node, first, where = stack.pop()
            if not where.size:
                continue
            if node.left is None or node.right is None:
                source[where] = node.lo
                continue
            a, d = self._w(node.left), self._w(node)
            q0, r0 = divmod(a * first + d // 2, d)
            k = np.arange(where.size + 1, dtype=np.int64)
            shares = (r0 + a * k) // d  # left records among the node's first + k, less q0
            left = np.diff(shares) > 0
            stack.append((node.left, q0, where[left]))
            stack.append((node.right, first - q0, where[~left]))
        return source


class Mixture:
    """Several streams as one, drawn by weight (see `mix`). A loader stream: position ``p``
    is record ``p - offsets[s]`` of source ``s``; a batch gathers each source's records in
    one call and puts them back in batch order, with ``"source"`` (each record's source
    number) added where the sources gather dicts.

    >>> import numpy as np
    >>> both = Mixture({"a": np.arange(3), "b": np.arange(10, 15)}, [1, 1])
    >>> len(both), both.__getitems__(np.array([4, 0, 3])).tolist()
    (8, [11, 0, 10])
    >>> both.weights_at(0)
    {'a': 0.5, 'b': 0.5}
    """

    def __init__(
        self,
        sources: Mapping[str, Stream | npt.NDArray[Any]],
        weights: Any,
        schedule: Mapping[int, Any] | None = None,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("mix takes a non-empty dict of name -> stream")
        self.sources = {name: as_streams({name: s})[name] for name, s in sources.items()}
        self.names = tuple(self.sources)
        for name, stream in self.sources.items():
            check_streams({name: stream})
        self.lengths = tuple(len(s) for s in self.sources.values())
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        steps = [0]
        phases = [_integer_weights(weights, self.names, "weights")]
        for step, later in sorted((schedule or {}).items()):
            at = check_int("a schedule step", step, minimum=1)
            steps.append(at)
            phases.append(_integer_weights(later, self.names, f"schedule[{at}]"))
        self.steps = tuple(steps)
        self.phases = tuple(_Phase(p) for p in phases)
        first = next(iter(self.sources.values()))
        # token windows of one shape are read in one call across their datasets
        self._windows = (
            [w for w in self.sources.values() if isinstance(w, TokenWindows)]
            if isinstance(first, TokenWindows) and all(map(first.alike, self.sources.values()))
            else None
        )

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def weights_at(self, step: int) -> dict[str, float]:
        """The weights in force at ``step``, normalised."""
        phase = self.phases[int(np.searchsorted(self.steps, step, side="right")) - 1]
        return {n: w / _SCALE for n, w in zip(self.names, phase.weights, strict=True)}

    def sampler(self, batch_size: int, seed: int = 0, mode: SamplerMode = "cyclic") -> MixSampler:
        """The sampler that draws this mixture ``batch_size`` records a step."""
        return MixSampler(self, batch_size, seed=seed, mode=mode)

    def __getitems__(self, indices: npt.NDArray[Any]) -> Any:
        if self._windows is not None:
            return TokenWindows.read_mixed(self._windows, self.offsets, indices)
        positions = positions_of(indices).astype(np.int64)
        source = np.searchsorted(self.offsets, positions, side="right") - 1
        parts: list[tuple[npt.NDArray[np.intp], Any]] = []
        for s in np.unique(source).tolist():
            where = np.flatnonzero(source == s)
            local = (positions[where] - self.offsets[s]).astype(np.uint64)
            parts.append((where, self.sources[self.names[s]].__getitems__(local)))
        merged = _merge(parts, positions.size, self.names)
        if isinstance(merged, dict) and _SOURCE not in merged:
            merged[_SOURCE] = source.astype(np.int16)
        return merged

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={w:.4g}" for n, w in self.weights_at(0).items())
        later = f", schedule at steps {list(self.steps[1:])}" if len(self.steps) > 1 else ""
        return f"Mixture({shares}{later})"


def _merge(parts: list[tuple[npt.NDArray[np.intp], Any]], n: int, names: Sequence[str]) -> Any:
    """The sources' gathered records put back in batch order."""
    first = parts[0][1]
    if isinstance(first, Mapping):
        keys = list(first)
        for _, value in parts:
            if not isinstance(value, Mapping) or list(value) != keys:
                got = list(value) if isinstance(value, Mapping) else type(value).__name__
                raise TypeError(f"the sources of a mixture gather different entries: {keys} "
                                f"from one, {got} from another")  # fmt: skip
        return {k: _merge([(w, v[k]) for w, v in parts], n, names) for k in keys}
    if isinstance(first, np.ndarray):
        arrays = [np.asarray(v) for _, v in parts]
        shapes = {(a.shape[1:], a.dtype) for a in arrays}
        if len(shapes) > 1:
            raise TypeError(
                f"the sources of a mixture gather records of different shapes or dtypes "
                f"({sorted(map(str, shapes))}); make them alike (the same seq_len, say)"
            )
        out = np.empty((n, *first.shape[1:]), first.dtype)
        for (where, _), array in zip(parts, arrays, strict=True):
            out[where] = array
        return out
    if isinstance(first, list):
        items: list[Any] = [None] * n
        for where, value in parts:
            for k, item in zip(where.tolist(), value, strict=True):
                items[k] = item
        return items
    raise TypeError(
        f"a mixture merges arrays, dicts of arrays and lists; a source gathered a "
        f"{type(first).__name__}"
    )


def _source_seed(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class MixSampler(StepSampler):
    """The batches of a `Mixture`: ``batch_size`` records a step, shared out by weight (see
    `chute.loader._mix`), each source drawn in its own order (``mode``: ``"cyclic"``, a
    permutation of the source per pass; ``"sequential"``; ``"iid"``).

    >>> import numpy as np
    >>> sampler = mix({"a": np.arange(6), "b": np.arange(6)}, [3, 1]).sampler(4, seed=0)
    >>> sampler.drawn(4 * 10)  # records of each source in the first 10 steps
    {'a': 30, 'b': 10}
    >>> (sampler.indices(7) >= 6).sum()  # one of every 4 from "b" (positions 6 and up)
    np.int64(1)
    """

    def __init__(
        self, mixture: Mixture, batch_size: int, *, seed: int = 0, mode: SamplerMode = "cyclic"
    ) -> None:
        super().__init__(len(mixture), batch_size, seed=seed)
        codes = {"sequential": sampler_codes.MODE_SEQUENTIAL, "iid": sampler_codes.MODE_IID,
                 "cyclic": sampler_codes.MODE_CYCLIC}  # fmt: skip
        if mode not in codes:
            raise ValueError(f"a mixture draws each source 'cyclic', 'sequential' or 'iid', "
                             f"not {mode!r}")  # fmt: skip
        self.mixture = mixture
        self.mode: SamplerMode = mode
        self._code = codes[mode]
        self._seeds = [_source_seed(self.seed, n) for n in mixture.names]
        self._blocks = DrawBlocks(self._positions)
        # which sources draw in an order of their own, asked once (a Protocol check is dear)
        self._ordered = [
            src if self._code == sampler_codes.MODE_CYCLIC and isinstance(src, Ordered) else None
            for src in (mixture.sources[n] for n in mixture.names)
        ]

    def drawn(self, records: int) -> dict[str, int]:
        """Records of each source among the run's first ``records`` (all steps together)."""
        counts = self._before(records)
        return dict(zip(self.mixture.names, counts, strict=True))

    def _before(self, records: int) -> list[int]:
        mixture, b = self.mixture, self.batch_size
        total = [0] * len(mixture.names)
        for k, phase in enumerate(mixture.phases):
            begin = mixture.steps[k] * b
            end = mixture.steps[k + 1] * b if k + 1 < len(mixture.steps) else None
            if records <= begin:
                break
            j = records - begin if end is None or records < end else end - begin
            for s, c in enumerate(phase.counts(j)):
                total[s] += c
        return total

    def fill(self, step: int, start: int, out: npt.NDArray[np.uint64]) -> None:
        self._blocks.fill(step * self.batch_size + start, out)

    def _positions(self, first: int, count: int) -> npt.NDArray[np.uint64]:
        """The positions of the run's records ``first .. first + count - 1``: the routing
        and each source's draws cost about the same for one step as for a hundred, so
        `DrawBlocks` asks for many steps at once."""
        b = self.batch_size
        out = np.empty(count, np.uint64)
        mixture = self.mixture
        done = 0
        while done < count:  # one phase at a time
            record = first + done
            k = int(np.searchsorted(mixture.steps, record // b, side="right")) - 1
            end = mixture.steps[k + 1] * b if k + 1 < len(mixture.steps) else record + count
            n = min(count - done, end - record)
            source = mixture.phases[k].route(record - mixture.steps[k] * b, n)
            before = self._before(record)
            for s in np.unique(source).tolist():
                where = np.flatnonzero(source == s)
                drawn = self._draw(s, before[s], where.size)
                out[done + where] = drawn + np.uint64(mixture.offsets[s])
            done += n
        return out

    def _draw(self, s: int, first: int, n: int) -> npt.NDArray[np.uint64]:
        """Positions of source ``s``'s draws ``first .. first + n - 1``."""
        length = self.mixture.lengths[s]
        ordered = self._ordered[s]
        if ordered is not None:
            return np.asarray(ordered.order(self._seeds[s], first, n), np.uint64)
        block = length if self._code == sampler_codes.MODE_CYCLIC else _IID_BLOCK
        if self._code == sampler_codes.MODE_SEQUENTIAL:
            return (np.arange(n, dtype=np.uint64) + np.uint64(first % length)) % np.uint64(length)
        out = np.empty(n, np.uint64)
        done = 0
        while done < n:
            step, at = divmod(first + done, block)
            take = min(n - done, block - at)
            _fill(self._code, length, block, self._seeds[s], step % (1 << 64), at,
                  out[done : done + take])  # fmt: skip
            done += take
        return out

    def fingerprint(self) -> Any:
        m = self.mixture
        return {
            "kind": "mix",
            "mode": self.mode,
            "sources": [[n, length] for n, length in zip(m.names, m.lengths, strict=True)],
            "phases": [[s, list(p.weights)] for s, p in zip(m.steps, m.phases, strict=True)],
        }

    def __repr__(self) -> str:
        return (
            f"MixSampler({self.mixture!r}, batch_size={self.batch_size}, seed={self.seed}, "
            f"mode={self.mode!r}, step={self._step})"
        )


def mix(
    sources: Mapping[str, Stream | npt.NDArray[Any]],
    weights: Mapping[str, float] | Sequence[float],
    *,
    schedule: Mapping[int, Mapping[str, float] | Sequence[float]] | None = None,
) -> Mixture:
    """Several streams as one, each step's batch holding each source by its weight.

    ``weights`` maps source names to weights (any scale), or lists them in the sources'
    order; ``schedule={step: weights}`` changes them from a step on. Pass the mixture to
    `chute.DataLoader` as its stream (alone, or by name): ``batch_size`` and ``seed`` come
    from the loader, ``sampler`` is how each source is drawn (``"cyclic"``, the default: a
    permutation of the source per pass through it). After any number of records every
    source's share is within a record or two of its weight (see `chute.loader._mix`); the
    run seeks, resumes and splits across processes (``shard=``) exactly. The sources are
    read by the loader's threads: none of its own, however many sources.

    >>> import numpy as np
    >>> from chute import DataLoader, mix
    >>> both = mix({"a": np.zeros(100), "b": np.ones(50)}, {"a": 0.75, "b": 0.25})
    >>> with DataLoader({"x": both}, batch_size=8, seed=0) as loader:
    ...     [int(next(loader)["x"].sum()) for _ in range(4)]
    [2, 2, 2, 2]
    """
    return Mixture(sources, weights, schedule)
