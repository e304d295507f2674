"""The row-wise hot log (`hot.jsonl`): one JSON object per completed step."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ._dtypes import Value, float_json

_STEP_KEY = "step"


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
    keys = _KEYS
    body = ",".join(
        [
            (keys.get(k) or _key(k)) + (v.json if v.json is not None else float_json(v.num))  # type: ignore[arg-type]
            for k, v in items
        ]
    )
    return f'{{"{_STEP_KEY}":{step}{"," if body else ""}{body}}}\n'.encode()


def parse_rows(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """Rows of a hot log; torn or corrupt lines (a crash mid-append) are skipped."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        step = row.pop(_STEP_KEY, None)
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            rows.append((step, row))
    return rows


def read_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows of the hot log at `path`, or none when it does not exist."""
    try:
        with open(path, "rb") as f:
            return parse_rows(f.read())
    except FileNotFoundError:
        return []
