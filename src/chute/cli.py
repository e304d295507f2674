"""The ``chute`` command: convert, inspect, verify and compact stores and sharded datasets;
``chute metrics ...``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chute._objects import local_path, reads_remotely
from chute._util.progress import Progress
from chute.datasets import _cli as sharded
from chute.datasets import is_sharded, write_dataset
from chute.datasets._internal import RecordSchema
from chute.errors import ChuteError
from chute.store import RecordStore
from chute.store._internal import CODEC_NAMES


def _load_npy(path: str) -> np.ndarray[Any, Any]:
    """The .npy file at ``path``, memory-mapped: a regular file (a FIFO would block for ever)
    holding a .npy array of plain data, or a ValueError naming the file and what it is."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file (np.save writes one)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # an overflowing header's shape
            array: np.ndarray[Any, Any] = np.load(path, mmap_mode="r", allow_pickle=False)
            return array
    except (ValueError, OSError, RuntimeWarning) as e:
        raise ValueError(f"{path}: not a .npy array of plain data chute can map ({e})") from None


def _convert(args: argparse.Namespace) -> int:
    array = _load_npy(args.input)
    try:
        ds = write_dataset(
            args.output, array, codec=args.codec, dict_size=args.dict_size, level=args.level,
            mode="a" if args.append else "w", overwrite=args.overwrite, progress=not args.quiet,
        )  # fmt: skip
    except FileExistsError:  # said in the command line's words, not the function's
        raise FileExistsError(
            f"{args.output} exists and is not empty; pass --append to add the rows to it or "
            "--overwrite to replace it"
        ) from None
    stats = ds.store.stats()
    print(
        f"wrote {stats['records']} records of {ds.item_shape} {ds.dtype} to {args.output}: "
        f"{_mib(stats['logical_bytes'])} -> {_mib(stats['live_bytes'])} "
        f"(ratio {stats['ratio']:.2f}x)"
    )
    ds.close()
    return 0


def _info_one(path: Path | str, options: dict[str, Any]) -> dict[str, Any]:
    if isinstance(path, str):
        return sharded.remote_info(path, **options)
    if is_sharded(path):
        return sharded.info_report(path)
    with RecordStore(path, mode="r") as store:
        stats = store.stats()
    try:
        stats["schema"] = sharded.schema_report(RecordSchema.read(path))
    except ChuteError:
        stats["schema"] = None
    return stats


def _print_info(path: Path | str, stats: dict[str, Any]) -> None:
    if "shards" in stats:
        sharded.print_info(stats)
        return
    schema = stats["schema"]
    if schema is None:
        print("schema:    none (a plain record store)")
    else:
        shape = tuple(schema["shape"])
        print(f"schema:    {schema['kind']}, dtype {schema['dtype']}, record shape {shape}")
    codecs = ", ".join(f"{k} {v}" for k, v in stats["codecs"].items())
    print(f"records:   {stats['records']}")
    print(f"codecs:    {codecs}")
    print(f"logical:   {_mib(stats['logical_bytes'])}")
    print(f"stored:    {_mib(stats['live_bytes'])} (ratio {stats['ratio']:.2f}x)")
    print(f"chunks:    {stats['chunks']} holding {_mib(stats['chunk_bytes'])}")
    print(f"garbage:   {_mib(stats['reclaimable'])} reclaimable by `chute compact`")
    if stats["short_bytes"]:
        print(f"DAMAGED:   the chunk files hold {stats['short_bytes']} bytes fewer than the "
              "records they should hold: `chute verify` names the records")  # fmt: skip
    print(f"table:     {_mib(stats['table_bytes'])} (meta.zr)")
    print(f"checksums: {_mib(stats['checksum_bytes'])} (crc32c.chute)" if stats["has_checksums"]
          else "checksums: none (written by another tool)")  # fmt: skip
    print(f"on disk:   {_mib(stats['disk_bytes'])} in all the store's files")
    print(f"dict.zr:   {'yes' if stats['has_dict'] else 'no'}")


def _info(args: argparse.Namespace) -> int:
    options = _store_options(args)
    return _each(args, lambda p: _info_one(p, options), _print_info)


def _print_verify(path: Path | str, report: dict[str, Any]) -> None:
    if "shards" in report:
        sharded.print_verify(report)
        return
    for item in report["damaged"]:
        print(f"DAMAGED record {item['index']}: {item['message']}")
    damaged = len(report["damaged"])
    if not report["has_checksums"]:
        print(
            "note: this store has no checksums (it was written by another tool), so verify "
            "cannot check record bytes; it checked that every record decodes"
        )
    elif report["unchecked"]:
        print(
            f"note: {report['unchecked']} records were written or moved by another tool "
            "and have no checksum: verify checked that they decode"
        )
    verdict = "damaged" if damaged else "ok"
    print(
        f"{verdict}: {report['records']} records: {report['checked']} matched their "
        f"checksum, {report['unchecked']} decoded without one, {damaged} damaged"
    )


def _verify(args: argparse.Namespace) -> int:
    options = _store_options(args)
    quiet = args.quiet or args.json
    return _each(args, lambda p: sharded.verify_report(p, quiet, **options), _print_verify)


def _store_options(args: argparse.Namespace) -> dict[str, Any]:
    """``-o KEY=VALUE`` options for the stores of URLs (a value is read as JSON where it is,
    so ``-o 'client_options={"allow_http": true}'`` gives a dict), checked before any use."""
    options: dict[str, Any] = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"-o takes KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    if options and not any(reads_remotely(name) for name in args.stores):
        raise ValueError("-o sets options of stores in object storage: no store is a URL")
    return options


def _each(
    args: argparse.Namespace,
    run: Callable[[Path | str], dict[str, Any]],
    show: Callable[[Path | str, dict[str, Any]], None],
) -> int:
    """Run a report over every path given: text with a header per store (when several), or
    one JSON list. A path that fails is reported and the others still run. Exit status: 2
    if any path failed, else 1 if any store is damaged, else 0."""
    results: list[dict[str, Any]] = []
    status = 0
    for name in args.stores:
        path: Path | str = name if reads_remotely(name) else Path(local_path(name))
        try:
            result = {"path": str(path), **run(path)}
        except (ChuteError, OSError, ValueError, TypeError) as e:  # TypeError: a bad -o
            print(f"chute {args.command}: error: {path}: {e}", file=sys.stderr)
            results.append({"path": str(path), "error": str(e)})
            status = 2
            continue
        results.append(result)
        if result.get("damaged"):
            status = max(status, 1)
        if not args.json:
            if len(args.stores) > 1:
                print(f"== {path}")
            show(path, result)
    if args.json:
        print(json.dumps(results, indent=2))
    return status


def _compact(args: argparse.Namespace) -> int:
    path = Path(args.store)
    RecordStore(path, mode="r").close()  # a store already: opening to write would make one
    with (
        RecordStore(path, mode="a") as store,
        Progress(None, f"compact {path.name}", show=not args.quiet) as bar,
    ):
        freed = store.compact(progress=bar.callback())
        stats = store.stats()
    print(f"freed {_mib(freed)}; {stats['records']} records in {_mib(stats['chunk_bytes'])}")
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chute", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="write a .npy array as a store, one record per row")
    c.add_argument("input", help="a .npy file (read memory-mapped)")
    c.add_argument("output", help="the store directory to create")
    c.add_argument(
        "--codec", choices=sorted(CODEC_NAMES), help="default zstd (appending: the store's)"
    )
    c.add_argument("--level", type=int, default=None, help="zstd level")
    c.add_argument("--dict-size", type=int, default=None, help="dictionary cap for zstd_dict")
    into = c.add_mutually_exclusive_group()
    into.add_argument("--overwrite", action="store_true", help="replace an existing store")
    into.add_argument("--append", action="store_true", help="add the rows to an existing store")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    c.set_defaults(run=_convert)
    for name, fn, text in (
        ("info", _info, "schema, record and codec counts, ratio, garbage, bytes on disk"),
        ("verify", _verify, "decode every record and check its checksum"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("stores", nargs="+", metavar="store", help="a folder or a URL")
        s.add_argument(
            "-o", "--option", action="append", metavar="KEY=VALUE",
            help="a store option for URLs (region=, endpoint= ...); credentials also come "
            "from the environment (AWS_*, GOOGLE_*, AZURE_*)",
        )  # fmt: skip
        s.add_argument("--json", action="store_true", help="one JSON list, a report per store")
        if name == "verify":
            s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        s.set_defaults(run=fn)
    s = sub.add_parser("compact", help="reclaim the space of deleted records")
    s.add_argument("store")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(run=_compact)
    sub.add_parser("metrics", help="the metric log: chute metrics --help", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["metrics"]:
        metrics_cli = importlib.import_module("chute.metrics._cli")
        return int(metrics_cli.main(args_list[1:]))
    args = _parser().parse_args(args_list)
    if args.command == "compact" and reads_remotely(args.store):
        print(
            f"chute compact: error: {args.store} is in object storage; compact works on a "
            "local folder (rewrite the dataset with chute.write_dataset instead)",
            file=sys.stderr,
        )
        return 2
    if args.command == "compact" and is_sharded(args.store):
        args.run = sharded.compact
    try:
        return int(args.run(args))
    except (ChuteError, OSError, ValueError, TypeError) as e:
        print(f"chute {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
