"""Conversion of ad-hoc `metrics.jsonl` logs (one object per step) into finished runs."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import numpy as np

from . import _config
from . import _format as F
from ._archive import zip_run
from ._columns import ColumnStore
from ._hot import orjson


def _loads(line: bytes) -> Any:
    """One JSON line; orjson when installed, the stdlib for NaN/Infinity literals."""
    if orjson is not None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    return json.loads(line)


JSONL_NAME = "metrics.jsonl"
#: What `--skipcols DEFAULT` skips: per-parameter norms that bloat logs.
DEFAULT_SKIP = r"[pg]norm.*"


@dataclass(frozen=True, slots=True)
class ConvertOptions:
    """How `convert_run` treats a log."""

    skip: tuple[str, ...] = ()
    allow_rewinds: bool = False


def find_runs(indirs: list[str], deep: bool) -> Iterator[tuple[str, str]]:
    """(run folder, its name relative to the search root's parent) for each folder with a log."""
    for indir in indirs:
        root = os.path.abspath(indir)
        parent = os.path.dirname(root)
        if deep:
            found = sorted(d for d, _s, files in os.walk(root) if JSONL_NAME in files and d != root)
        else:
            children = (os.path.join(root, c) for c in sorted(os.listdir(root)))
            found = [c for c in children if os.path.isfile(os.path.join(c, JSONL_NAME))]
        for run in found:
            yield run, os.path.relpath(run, parent)


_MISSING = object()


def _parse(path: str) -> list[tuple[int, Any]]:
    """(line number, parsed object) of each non-blank line; a torn last line is dropped."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, _loads(line)))
        except ValueError:
            if lineno == len(lines):
                break  # torn last line of a log that is still being written
            raise ValueError(f"{path}:{lineno}: not valid JSON") from None
    return out


def _rows(path: str, allow_rewinds: bool) -> tuple[list[int], list[dict[str, Any]]]:
    """Steps and row objects of a log, rewinds applied (or rejected)."""
    steps: list[int] = []
    rows: list[dict[str, Any]] = []
    prev = -1
    for lineno, row in _parse(path):
        if type(row) is not dict:
            raise ValueError(f"{path}:{lineno}: expected a JSON object per line")
        step = row.pop("step", prev + 1)
        if type(step) is not int or not prev < step <= F.MAX_STEP:
            if type(step) is not int or not 0 <= step <= F.MAX_STEP:
                raise ValueError(f"{path}:{lineno}: step {step!r} is not a uint32 integer")
            if not allow_rewinds:
                raise ValueError(
                    f"{path}:{lineno}: step {step} after {prev}; steps must increase "
                    "(pass --allow-rewinds to truncate to the earlier step)"
                )
            while steps and steps[-1] >= step:
                steps.pop()
                rows.pop()
        prev = step
        steps.append(step)
        rows.append(row)
    return steps, rows


Column = tuple[np.ndarray[Any, Any], list[Any]]


def _columns(path: str, opts: ConvertOptions) -> dict[str, Column]:
    """Per-metric (steps, values) of a log, skipped metrics left out."""
    steps, rows = _rows(path, opts.allow_rewinds)
    names: dict[str, None] = {}
    seen: Any = None
    uniform = True  # every row has the same keys in the same order
    for row in rows:
        keys = row.keys()
        if keys != seen:
            uniform = seen is None
            names.update(dict.fromkeys(keys))
            seen = keys
    if uniform and rows:
        first = tuple(rows[0])
        uniform = all(tuple(row) == first for row in rows)
    by_column = zip(*map(dict.values, rows), strict=True) if uniform else iter(())
    transposed = dict(zip(names, by_column, strict=uniform))
    skip = re.compile("|".join(f"(?:{p})" for p in opts.skip)) if opts.skip else None
    all_steps = np.array(steps, dtype=F.INDEX_DTYPE)
    cols: dict[str, Column] = {}
    space = F.NameSpace()
    for name in names:
        if skip is not None and skip.fullmatch(name):
            continue
        F.check_name(name)
        problem = space.clash(name)
        if problem is not None:
            raise ValueError(f"{path}: {problem}")
        space.add(name)
        if uniform:
            cols[name] = (all_steps, list(transposed[name]))
            continue
        values = [row.get(name, _MISSING) for row in rows]
        if values.count(_MISSING):
            keep = [i for i, v in enumerate(values) if v is not _MISSING]
            cols[name] = (all_steps[keep], [values[i] for i in keep])
        else:
            cols[name] = (all_steps, values)
    return cols


def _encode(values: list[Any]) -> tuple[str, bytes]:
    """Storage code and bytes of a column, following the writers' auto-dtype rules."""
    kinds = set(map(type, values))
    if kinds == {int}:
        try:
            return "i64", np.array(values, dtype="<i8").tobytes()
        except OverflowError:
            if min(values) >= 0 and max(values) < 2**64:
                return "u64", np.array(values, dtype="<u8").tobytes()
    elif kinds <= {int, float}:
        # A JSON number with a fraction is a double: stored as f64, like a Python float.
        ints = [v for v in values if type(v) is int] if int in kinds else []
        if all(int(float(v)) == v for v in ints):
            return "f64", np.array(values, dtype="<f8").tobytes()
    dumps, enc = json.dumps, encode_basestring_ascii
    text = [enc(v) if type(v) is str else dumps(v) for v in values]
    return F.JSONL, ("\n".join(text) + "\n").encode()


def convert_run(run_dir: str, out_path: str, opts: ConvertOptions) -> tuple[int, int]:
    """Convert `run_dir/metrics.jsonl` (+ `config.json`) into the archive `out_path`.

    Returns (rows, columns). The archive is written to a temporary name and renamed,
    so an existing one is replaced atomically and a failure leaves it as it was.
    """
    cols = _columns(os.path.join(run_dir, JSONL_NAME), opts)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    staging = out_path + ".staging" + F.TMP_SUFFIX
    if os.path.exists(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)
    try:
        store = ColumnStore(staging)
        encoded = {n: (s, _encode(v)) for n, (s, v) in cols.items() if len(s)}
        for name, (_steps, (code, _data)) in encoded.items():
            store.add(name, code)
        store.prepare({n: s for n, (s, _enc) in encoded.items()})
        for name, (steps, (code, data)) in encoded.items():
            store.append_raw(name, data, steps.tobytes(), steps)
            if code != F.JSONL:
                store.cols[name].mono.add_array(np.frombuffer(data, F.NUMERIC_DTYPES[code]))
        store.optimize()
        config = _config.read(os.path.join(run_dir, F.CONFIG), run_dir)
        F.atomic_write(os.path.join(staging, F.CONFIG), F.dump_json(config))
        zip_run(staging, out_path)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging)
    rows = max((len(s) for s, _v in cols.values()), default=0)
    return rows, sum(1 for s, _v in cols.values() if len(s))
