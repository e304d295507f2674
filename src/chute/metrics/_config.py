"""The run's `config.json`: a dict written in place or a symlink to a file of the run."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from chute._util.safe_open import read_regular
from chute.errors import CorruptRunError

from . import _format as F
from ._source import limit_of

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


def parse(data: bytes, where: str) -> dict[str, Any]:
    """A config file's bytes as its dict ({} when empty); `CorruptRunError` naming `where`
    when they are not a JSON object."""
    try:
        cfg = json.loads(data or b"{}")
    except (ValueError, RecursionError) as e:
        raise CorruptRunError(f"{where} is not valid JSON ({e})", path=where) from None
    if not isinstance(cfg, dict):
        raise CorruptRunError(f"{where} does not hold a JSON object", path=where)
    return cfg


def read(path: str, root: str | None) -> dict[str, Any]:
    """The config at `path` ({} when absent), a regular file of bounded size that resolves
    inside `root` (None: wherever the writer's own link leads)."""
    if root is None:
        root = os.path.dirname(os.path.realpath(path))
    try:
        data = read_regular(path, root, limit_of(F.CONFIG))
    except FileNotFoundError:
        return {}
    return parse(data, path)


def override(pdir: str, overrides: Mapping[str, Any]) -> None:
    """Shallow-merge `overrides` into the finalized config as a plain file."""
    dest = os.path.join(pdir, F.CONFIG)
    merged = {**read(dest, None), **overrides}
    replace(dest, F.dump_json(merged))
