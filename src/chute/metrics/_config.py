"""The run's `config.json`: a dict written in place or a symlink to a file of the run."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from . import _format as F

ConfigArg = Mapping[str, Any] | str | os.PathLike[str] | None


def freeze(config: ConfigArg) -> bytes | str | None:
    """Validate a config argument up front: JSON bytes for a dict, a path for a link."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        try:
            return F.dump_json(dict(config))
        except (TypeError, ValueError) as e:
            raise TypeError(f"config is not JSON serialisable: {e}") from None
    if isinstance(config, (str, os.PathLike)):
        return os.fspath(config)
    raise TypeError(f"config must be a dict, a path or None, got {type(config).__name__}")


def freeze_dict(config: Mapping[str, Any]) -> bytes:
    """`set_config()`'s argument as JSON bytes: a dict, never a path or None."""
    frozen = freeze(config)
    if not isinstance(frozen, bytes):
        raise TypeError("set_config() takes a dict")
    return frozen


def apply(frozen: bytes | str | None, outdir: str, pdir: str) -> None:
    """Write or link `pdir/config.json` as the writer's `config` argument asks.

    A path whose file does not exist leaves an existing config alone (a resumed run
    keeps its dict config) and otherwise writes an empty one.
    """
    dest = os.path.join(pdir, F.CONFIG)
    if frozen is None:
        if not os.path.lexists(dest):
            F.atomic_write(dest, b"{}")
        return
    if isinstance(frozen, bytes):
        replace(dest, frozen)
        return
    target = os.path.abspath(os.path.join(outdir, frozen))
    if not os.path.isfile(target):
        if not os.path.isfile(dest):  # absent, or a link whose target is gone
            replace(dest, b"{}")
        return  # a resumed run keeps the config it has
    tmp = dest + F.TMP_SUFFIX
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, dest)


def replace(dest: str, data: bytes) -> None:
    """Atomically replace the config file; a link is replaced, its target left alone."""
    F.atomic_write(dest, data)


def read(path: str) -> dict[str, Any]:
    """The config at `path` ({} when absent)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def override(pdir: str, overrides: Mapping[str, Any]) -> None:
    """Shallow-merge `overrides` into the finalized config as a plain file."""
    dest = os.path.join(pdir, F.CONFIG)
    merged = {**read(dest), **overrides}
    replace(dest, F.dump_json(merged))
