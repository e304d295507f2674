"""Chunk transforms (run once per decoded slab, cached) and batch transforms (per batch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._store import StoreLike

SAMPLE_INDICES = "sample_indices"


class Batch(dict[str, np.ndarray]):
    """One batch: ``{variable: array, "sample_indices": int64 array}``, samples on axis 0.

    It is a plain dict (``batch["t2m"]``, iteration over its keys) that also reads as
    insitubatch's batch: ``batch.arrays`` (the variables only), ``batch.sample_indices``,
    ``batch.offsets`` (each variable's sample-axis read offset: 0 but for windowed
    views), ``batch.read_indices(label)`` and ``batch.stack(labels)``.

    >>> b = Batch(t2m=np.zeros((2, 3)), sample_indices=np.array([4, 7]))
    >>> sorted(b), list(b.arrays), b.sample_indices.tolist()
    (['sample_indices', 't2m'], ['t2m'], [4, 7])
    """

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The variables without ``sample_indices`` (a new dict over the same arrays)."""
        return {k: v for k, v in self.items() if k != SAMPLE_INDICES}

    @property
    def sample_indices(self) -> np.ndarray:
        """Position of each row along the stored sample axis."""
        return self[SAMPLE_INDICES]

    read_offsets: Mapping[str, int] = {}
    """Read offsets of the windowed variables (the others read at offset 0)."""

    @property
    def offsets(self) -> dict[str, int]:
        """Sample-axis read offset of each variable: row ``i`` of ``v`` is sample
        ``sample_indices[i] + offsets[v]`` (0 except for windowed views)."""
        return {k: int(self.read_offsets.get(k, 0)) for k in self.arrays}

    def read_indices(self, label: str) -> np.ndarray:
        """The sample each row of ``label`` was read from (``sample_indices`` + offset)."""
        if label not in self.arrays:
            raise KeyError(f"no variable {label!r} in this batch (has {sorted(self.arrays)})")
        return self.sample_indices + self.read_offsets.get(label, 0)

    def stack(self, labels: Sequence[str], axis: int = 1) -> np.ndarray:
        """The ``labels``' arrays stacked along a new ``axis``, in the order given."""
        missing = [k for k in labels if k not in self.arrays]
        if missing:
            raise KeyError(f"no variables {missing} in this batch (has {sorted(self.arrays)})")
        return np.stack([self[k] for k in labels], axis=axis)


BatchTransform = Callable[[Batch], Mapping[str, np.ndarray]]
"""``batch -> {key: array}``: runs on every assembled batch, after the chunk transforms, to
add, drop or combine keys (``InSituDataset(batch_transforms=[...])``); the keys it returns
are the batch's, so keep ``"sample_indices"`` if you need it."""


class ChunkTransform(Protocol):
    """``(variable, chunk) -> chunk``: ``chunk`` has its samples on axis 0.

    Runs once per decoded slab, before caching, so it must be deterministic and keep the
    shape (the dtype may change, e.g. to float32).

    Any function of that signature will do:

    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> def half(variable, chunk):
    ...     return chunk.astype(np.float16) if variable == "t2m" else chunk
    >>> ds = InSituDataset(path, manifest, batch_size=8, chunk_transforms=[half])
    >>> next(iter(ds.val))["t2m"].dtype, ds.batch_spec()["t2m"]
    (dtype('float16'), ((None, 2), dtype('float16')))
    >>> ds.close()
    """

    def __call__(self, variable: str, chunk: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class StandardScaler:
    """``(x - mean) / std`` per variable; variables without statistics pass through.

    A `ChunkTransform`: build it from known statistics, or `fit` it on the training split.

    >>> StandardScaler(mean={"t2m": 10.0}, std={"t2m": 2.0})("t2m", np.array([10.0, 14.0]))
    array([0., 2.])
    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> scaler = StandardScaler.fit(path, manifest)  # train chunks only: samples 0..19
    >>> scaler.mean
    {'t2m': 19.5}
    >>> ds = InSituDataset(path, manifest, batch_size=8, chunk_transforms=[scaler])
    >>> x = np.concatenate([batch["t2m"] for batch in ds.train])
    >>> bool(abs(x.mean()) < 1e-6), round(float(x.std()), 4)
    (True, 1.0)
    >>> ds.close()
    """

    mean: Mapping[str, float]
    std: Mapping[str, float]

    def __post_init__(self) -> None:
        if set(self.mean) != set(self.std):
            raise ValueError(
                f"mean and std name different variables: {set(self.mean) ^ set(self.std)}"
            )
        bad = [k for k, s in self.std.items() if not np.isfinite(s) or s <= 0]
        if bad:
            raise ValueError(f"std must be finite and positive; not for {bad}")

    def __call__(self, variable: str, chunk: np.ndarray) -> np.ndarray:
        if variable not in self.mean:
            return chunk
        dtype = chunk.dtype if np.issubdtype(chunk.dtype, np.floating) else np.dtype(np.float32)
        out = chunk.astype(dtype, copy=True)
        out -= dtype.type(self.mean[variable])
        out /= dtype.type(self.std[variable])
        return out

    @classmethod
    def fit(
        cls,
        url: StoreLike,
        manifest: Any,
        variables: list[str] | None = None,
        *,
        n_chunks: int = 16,
        split: str = "train",
        seed: int = 0,
        **store_kwargs: Any,
    ) -> StandardScaler:
        """Estimate mean and std per variable from ``n_chunks`` random chunks of ``split``.

        Only the training split is read by default, so validation statistics do not leak
        into the scaling. NaNs are ignored.
        """
        import zarr

        from chute._objects import check_options

        from ._geometry import open_geometries
        from ._store import open_store

        names = ["variables", "n_chunks", "split", "seed"]
        check_options(url, store_kwargs, "StandardScaler.fit", names)
        store = open_store(url, **store_kwargs)
        geoms = open_geometries(store, variables)
        ids = manifest.chunk_ids(split)
        if len(ids) == 0:
            raise ValueError(f"split {split!r} has no chunks to fit on")
        picked = np.random.default_rng(seed).choice(
            ids, size=min(n_chunks, len(ids)), replace=False
        )
        mean: dict[str, float] = {}
        std: dict[str, float] = {}
        for name, geom in geoms.items():
            if geom.n_samples != manifest.n_samples:
                continue
            arr = zarr.open_array(store=store, path=geom.path, mode="r")
            total, total_sq, count = 0.0, 0.0, 0
            for c in np.sort(picked):
                lo = int(c) * manifest.sample_chunk_size
                hi = min(lo + manifest.sample_chunk_size, geom.n_samples)
                sel = [slice(None)] * len(geom.shape)
                sel[geom.sample_axis] = slice(lo, hi)
                values = np.asarray(arr[tuple(sel)], dtype=np.float64)
                values = values[np.isfinite(values)]
                total += float(values.sum())
                total_sq += float(np.square(values).sum())
                count += values.size
            if count == 0:
                raise ValueError(f"no finite values in the sampled chunks of {name!r}")
            mu = total / count
            mean[name] = mu
            std[name] = max(float(np.sqrt(max(total_sq / count - mu * mu, 0.0))), 1e-12)
        return cls(mean=mean, std=std)


def run_chunk_transform(t: ChunkTransform, name: str, data: np.ndarray) -> np.ndarray:
    """``t(name, data)``, checked: an array of ``data``'s shape (the dtype may change)."""
    out = t(name, data)
    if not isinstance(out, np.ndarray):
        raise TypeError(
            f"chunk transform {t!r} returned {type(out).__name__} for variable {name!r}, "
            "not a numpy array: return the (transformed) chunk"
        )
    if out.shape != data.shape:
        raise ValueError(
            f"chunk transform {t!r} changed the shape of {name!r} from {data.shape} to {out.shape}"
        )
    return out


def run_batch_transform(t: BatchTransform, batch: Batch) -> Batch:
    """``t(batch)``, checked: a mapping of keys to arrays, made a `Batch`."""
    out = t(batch)
    if isinstance(out, Batch):
        return out
    if not isinstance(out, Mapping):
        raise TypeError(
            f"batch transform {t!r} returned {type(out).__name__}, not a dict of arrays: "
            "return the (transformed) batch"
        )
    return Batch(out)
