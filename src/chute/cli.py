"""The ``chute`` command: convert, inspect, verify and compact stores and sharded datasets;
``chute metrics ...``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from chute._schema import read_schema
from chute.dataset import write_dataset
from chute.datasets import is_sharded
from chute.datasets._cli import COMMANDS as SHARDED_COMMANDS
from chute.errors import ChuteError
from chute.store import RecordStore
from chute.store._format import CODEC_NAMES


def _convert(args: argparse.Namespace) -> int:
    array = np.load(args.input, mmap_mode="r", allow_pickle=False)
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


def _info(args: argparse.Namespace) -> int:
    path = Path(args.store)
    with RecordStore(path, mode="r") as store:
        stats = store.stats()
    try:
        schema = read_schema(path)
        kind = "ragged" if schema.get("ragged") else "fixed"
        shape = schema.get("item_shape", schema.get("shape", ()))
        print(f"schema:    {kind}, dtype {schema['dtype']}, record shape {tuple(shape)}")
    except ChuteError:
        print("schema:    none (a plain record store)")
    codecs = ", ".join(f"{k} {v}" for k, v in stats["codecs"].items())
    print(f"records:   {stats['records']}")
    print(f"codecs:    {codecs}")
    print(f"logical:   {_mib(stats['logical_bytes'])}")
    print(f"stored:    {_mib(stats['live_bytes'])} (ratio {stats['ratio']:.2f}x)")
    print(f"chunks:    {stats['chunks']} holding {_mib(stats['chunk_bytes'])}")
    print(f"garbage:   {_mib(stats['reclaimable'])} reclaimable by `chute compact`")
    print(f"dict.zr:   {'yes' if stats['has_dict'] else 'no'}")
    print(f"checksums: {'yes' if stats['has_checksums'] else 'no (written by another tool)'}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    with RecordStore(args.store, mode="r") as store:
        report = store.verify()
        has_sums = store.has_checksums
    for index, message in report["damaged"]:
        print(f"DAMAGED record {index}: {message}")
    checked = report["records"] - report["unchecked"]
    if not has_sums:
        print(
            "note: this store has no checksums (it was written by another tool), so verify "
            "cannot check record bytes; it checked that every record decodes"
        )
    elif report["unchecked"]:
        print(f"note: {report['unchecked']} records have no checksum (written by another tool)")
    verdict = "damaged" if report["damaged"] else "ok"
    print(
        f"{verdict}: {report['records']} records decoded, {checked} checksums matched, "
        f"{len(report['damaged'])} damaged"
    )
    return 1 if report["damaged"] else 0


def _compact(args: argparse.Namespace) -> int:
    with RecordStore(args.store, mode="a") as store:
        freed = store.compact()
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
        ("info", _info, "schema, record and codec counts, ratio, garbage"),
        ("verify", _verify, "decode every record and check its checksum"),
        ("compact", _compact, "reclaim the space of deleted records, in place"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("store")
        s.set_defaults(run=fn)
    sub.add_parser("metrics", help="the metric log: chute metrics --help", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["metrics"]:
        metrics_cli = importlib.import_module("chute.metrics._cli")
        return int(metrics_cli.main(args_list[1:]))
    args = _parser().parse_args(args_list)
    if args.command in SHARDED_COMMANDS and is_sharded(args.store):
        args.run = SHARDED_COMMANDS[args.command]
    try:
        return int(args.run(args))
    except (ChuteError, OSError, ValueError) as e:
        print(f"chute {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
