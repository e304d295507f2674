"""JSON lines of a run: the row-wise hot log (`hot.jsonl`, one JSON object per completed
step) and the values of `.jsonl` columns."""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Iterable
from itertools import repeat
from typing import Any

import numpy as np

from chute._util.safe_open import read_regular
from chute.errors import CorruptRunError

from ._dtypes import Value, float_json
from ._format import HOT as HOT_NAME
from ._format import JSONL, NUMERIC_DTYPES
from ._source import limit_of

try:  # the metrics extra's fast JSON, for the hot log here and `_jsonl`'s conversion
    import orjson as orjson
except ImportError:  # pragma: no cover - orjson comes with the metrics extra
    orjson = None  # type: ignore[assignment]

_STEP_KEY = "step"
_VALUE_OF, _JSON_OF = operator.itemgetter(1), operator.attrgetter("json")


_KEYS: dict[str, str] = {}


def _key(name: str) -> str:
    """`"name":` as JSON, memoised: a run logs the same few names every step."""
    text = _KEYS.get(name)
    if text is None:
        if len(_KEYS) > 100_000:
            _KEYS.clear()
        text = _KEYS[name] = json.dumps(name) + ":"
    return text


def encode_row(step: int, items: Iterable[tuple[str, Value]]) -> bytes:
    """One hot-log line from captured values."""
    items = list(items)
    if all(map(operator.is_, map(_JSON_OF, map(_VALUE_OF, items)), repeat(None))):
        # plain floats: a C encoder (orjson's when installed and every value is finite,
        # since it writes NaN as null; else json's), the shortest text that reads back
        row: dict[str, Any] = {_STEP_KEY: step, **{k: v.num for k, v in items}}
        if orjson is not None and math.isfinite(sum(row.values())):
            return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)  # type: ignore[no-any-return]
        return (json.dumps(row, separators=(",", ":")) + "\n").encode()
    keys = _KEYS
    body = ",".join(
        [
            (keys.get(k) or _key(k)) + (v.json if v.json is not None else float_json(v.num))  # type: ignore[arg-type]
            for k, v in items
        ]
    )
    return f'{{"{_STEP_KEY}":{step}{"," if body else ""}{body}}}\n'.encode()


def parse_rows(data: bytes, path: str = HOT_NAME) -> list[tuple[int, dict[str, Any]]]:
    """Rows of a hot log. An unterminated last line is a torn append (a crash) and is
    skipped; any complete line that is not a row is damage (`CorruptRunError`)."""
    rows: list[tuple[int, dict[str, Any]]] = []
    lines = data.split(b"\n")
    for lineno, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        step = row.pop(_STEP_KEY, None) if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise CorruptRunError(
                f"{path}:{lineno}: not a hot-log row ({line[:60]!r}); the run is damaged "
                "(repair or delete that line to read or resume it)",
                path=path,
                line=lineno,
            )
        rows.append((step, row))  # type: ignore[arg-type]
    return rows


def read_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows of the hot log at `path`, or none when it does not exist; it must be a regular
    file of its folder, of at most the size a hot log may reach (`UnsafeFileError`)."""
    try:
        data = read_regular(path, os.path.dirname(os.path.abspath(path)), limit_of(HOT_NAME))
    except FileNotFoundError:
        return []
    return parse_rows(data, path)


HotColumns = dict[str, tuple[list[int], list[Any]]]


def by_column(rows: list[tuple[int, dict[str, Any]]]) -> HotColumns:
    """Hot rows turned into (steps, values) per metric."""
    cols: HotColumns = {}
    for step, row in rows:
        for k, v in row.items():
            steps, vals = cols.setdefault(k, ([], []))
            steps.append(step)
            vals.append(v)
    return cols


def rows_after(col: tuple[list[int], list[Any]] | None, last: int) -> list[tuple[int, Any]]:
    """(step, value) of a hot column after step `last`, strictly increasing."""
    out = []
    for s, v in zip(*(col or ((), ())), strict=True):
        if s > last:
            out.append((s, v))
            last = s
    return out


def parse_values(data: bytes, where: str) -> tuple[list[Any], bool]:
    """(values, whether a torn last line was left out) of a `.jsonl` column's bytes; a complete
    line that is not JSON is damage (`CorruptRunError` naming `where` and the line)."""
    lines = data.split(b"\n")  # an unterminated last line is a torn append
    vals = []
    for lineno, line in enumerate(lines[:-1], 1):
        try:
            vals.append(json.loads(line))
        except ValueError:
            raise CorruptRunError(
                f"{where}:{lineno}: not a JSON value; the run is damaged", path=where, line=lineno
            ) from None
    return vals, lines[-1] != b""


def objects(values: list[Any]) -> np.ndarray[Any, Any]:
    """A 1-d object array of `values` (never a 2-d one of lists)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def hot_array(values: list[Any], code: str) -> np.ndarray[Any, Any]:
    """Hot-log values in the column's storage dtype (a wider one if a promotion is pending)."""
    if code == JSONL:
        return objects(values)
    try:
        return np.array(values, dtype=NUMERIC_DTYPES[code])
    except (OverflowError, TypeError, ValueError):
        return np.array(values)
