"""The runs table: which runs a query lists, which config keys differ among them, and
what each row carries (its summary, the config columns shown, last values of metrics).

A query names config keys (flattened: `model.depth`), the run's own fields (`run`,
`status`, `step`, `written`, `metrics`) and the metrics whose last values the table shows.
A config key wins over a run field of the same name; `config.KEY` always means the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from .._query import Query, run_row

#: Config columns shown by default (the differing keys, in key order), and the most keys
#: a listing names for the column chooser.
MAX_DIFFER, MAX_KEYS = 64, 2000
#: What a row says of its run besides config and last values.
PUBLIC = (
    *("id", "name", "kind", "status", "last_step", "last_write", "metrics", "version"),
    *("error", "config_error"),
)


def jsonable(value: Any) -> Any:
    """`value` with non-finite floats as the strings "nan", "inf", "-inf" (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def fields(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a query can name of one run."""
    return run_row(
        summary.get("config", {}),
        summary.get("last", {}),
        run=summary["name"],
        status=summary["status"],
        step=summary.get("last_step"),
        written=summary.get("last_write"),
        metrics=summary.get("metrics"),
    )


def _token(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing(configs: list[Mapping[str, Any]]) -> list[str]:
    """Config keys whose value is not the same in every one of `configs` (missing counts
    as a value of its own), in key order."""
    seen: dict[str, set[str]] = {}
    present: dict[str, int] = {}
    for cfg in configs:
        for key, value in cfg.items():
            seen.setdefault(key, set()).add(_token(value))
            present[key] = present.get(key, 0) + 1
    return sorted(k for k, v in seen.items() if len(v) > 1 or present[k] < len(configs))


def listing(
    summaries: list[dict[str, Any]],
    query: Query,
    columns: Iterable[str],
    last: Iterable[str],
) -> dict[str, Any]:
    """The table's answer: the runs `query` matches, each with the config columns shown
    (the differing keys and `columns`) and the last values of `last`."""
    rows = [s for s in summaries if not query.text.strip() or query.matches(fields(s))]
    configs = [s["config"] for s in rows if "error" not in s]  # a run in error has none known
    differ = differing(configs)
    shown = [*dict.fromkeys([*differ[:MAX_DIFFER], *columns])]
    keys = sorted({k for cfg in configs for k in cfg})
    wanted = [*last]
    out = []
    for s in rows:
        row = {k: s[k] for k in PUBLIC if k in s}
        row["config"] = {k: jsonable(s["config"][k]) for k in shown if k in s["config"]}
        row["last"] = {k: jsonable(s["last"][k]) for k in wanted if k in s["last"]}
        out.append(row)
    return {
        "runs": out,
        "total": len(summaries),
        "differ": differ,
        "keys": keys[:MAX_KEYS],
        "more_keys": max(0, len(keys) - MAX_KEYS),
    }


def diff(
    names: list[str], configs: list[Mapping[str, Any]], errors: list[str | None]
) -> dict[str, Any]:
    """The config keys on which the given runs differ, with each run's value (absent
    where a run lacks the key). A run whose config cannot be read (``errors``) counts for
    no key: its cells say so (``unreadable``), never "absent"."""
    keys = differing([c for c, e in zip(configs, errors, strict=True) if e is None])
    return {
        "runs": names,
        "config_errors": errors,
        "keys": [
            {
                "key": k,
                "values": [jsonable(c[k]) if k in c else None for c in configs],
                "present": [k in c for c in configs],
                "unreadable": [e is not None for e in errors],
            }
            for k in keys
        ],
    }
