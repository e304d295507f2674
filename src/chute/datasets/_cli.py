"""``chute info``, ``verify`` and ``compact`` over a sharded dataset (per shard and in total),
and the verify report of any record source."""

from __future__ import annotations

import argparse
import contextlib
import functools
from bisect import bisect_right
from pathlib import Path
from typing import Any

from chute._util.progress import Progress
from chute.datasets._folders import RemoteFolder
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import read_manifest
from chute.datasets._sharded_store import ShardedStore, open_source
from chute.datasets._sharded_write import recover, writer_lock
from chute.errors import ChuteError
from chute.store import RecordStore
from chute.store._internal import VerifyReport


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def info_report(path: Any, **store_options: Any) -> dict[str, Any]:
    """`RecordStore.stats` summed over the shards, with each shard's own and the schema."""
    return _sharded_info(ShardedStore(path, **store_options))


def _sharded_info(store: ShardedStore) -> dict[str, Any]:
    with store:
        m = store.manifest
        stats = store.stats()
    stats["schema"] = schema_report(m.schema)
    stats["shard_records"] = m.shard_records
    stats["shard_names"] = [name for name, _ in m.shards]
    return stats


def remote_info(url: str, **store_options: Any) -> dict[str, Any]:
    """``chute info`` of a dataset at a URL: a sharded one's report, or one store's stats
    and schema (None where it has no schema.json: a plain record store)."""
    folder = RemoteFolder.open(url, store_options, "chute info")
    if folder.sharded:
        return _sharded_info(ShardedStore.over(folder, verify=False, num_threads=None))
    try:
        schema: dict[str, Any] | None = schema_report(folder.schema())
    except ChuteError:
        schema = None
    with folder.store(verify=False, num_threads=None) as store:
        stats = store.stats()
    stats["schema"] = schema
    return stats


def schema_report(schema: RecordSchema) -> dict[str, Any]:
    """A schema as ``chute info`` shows it: kind, dtype and record shape."""
    return {"kind": schema.kind, "dtype": str(schema.dtype), "shape": list(schema.item_shape)}


def print_info(stats: dict[str, Any]) -> None:
    schema = stats["schema"]
    names = stats["shard_names"]
    print(f"sharded:   {len(names)} shards of at most {stats['shard_records']} records")
    print(f"schema:    {schema['kind']}, dtype {schema['dtype']}, shape {tuple(schema['shape'])}")
    for name, s in zip(names, stats["shards"], strict=True):
        print(
            f"  {name}  {s['records']:>10} records  {_mib(s['live_bytes']):>12} stored  "
            f"ratio {s['ratio']:.2f}x  garbage {_mib(s['reclaimable'])}"
        )
    codecs = ", ".join(f"{k} {v}" for k, v in stats["codecs"].items())
    print(f"records:   {stats['records']}")
    print(f"codecs:    {codecs}")
    print(f"logical:   {_mib(stats['logical_bytes'])}")
    print(f"stored:    {_mib(stats['live_bytes'])} (ratio {stats['ratio']:.2f}x)")
    print(f"garbage:   {_mib(stats['reclaimable'])} reclaimable by `chute compact`")
    print(f"checksums: {'yes' if stats['has_checksums'] else 'no (written by another tool)'}")


def verify_report(path: Any, quiet: bool, **store_options: Any) -> dict[str, Any]:
    """Verify the store or sharded dataset at ``path`` (a folder or a URL) through its
    `RecordSource`; damage never stops it. A damaged record is named by its index (and, in a
    sharded dataset, its shard and index there); a shard that could not be verified at all,
    by its name."""
    name = path.name if isinstance(path, Path) else str(path).rstrip("/").rsplit("/", 1)[-1]
    with (
        contextlib.closing(open_source(path, **store_options)) as source,
        Progress(None, f"verify {name}", show=not quiet) as bar,
    ):
        report = source.verify(progress=bar.callback())
        # a shard without checksums is damage (chute always writes them): it is reported
        # among the parts, so only a single store can lack them
        return as_document(report, "parts" in report or source.has_checksums)


def as_document(report: VerifyReport, has_checksums: bool) -> dict[str, Any]:
    """A `VerifyReport` as ``chute verify --json`` writes it (``shards`` for a sharded one)."""
    parts = report.get("parts", [])
    firsts = [part["first"] for part in parts]
    damaged: list[dict[str, Any]] = [
        {"index": None, "shard": part["name"], "message": part["message"]}
        for part in parts
        if part["state"] == "unreadable"
    ]
    for index, message in report["damaged"]:
        item: dict[str, Any] = {"index": index, "message": message}
        if parts:
            part = parts[bisect_right(firsts, index) - 1]
            item.update(shard=part["name"], local=index - part["first"])
        damaged.append(item)
    doc: dict[str, Any] = {
        "records": report["records"],
        "checked": report["checked"],
        "unchecked": report["unchecked"],
        "damaged": damaged,
        "has_checksums": has_checksums,
    }
    if parts:
        doc["shards"] = [
            {"name": part["name"], "records": part["records"], "state": part["state"]}
            for part in parts
        ]
    return doc


def print_verify(report: dict[str, Any]) -> None:
    for item in report["damaged"]:
        if item["index"] is None:
            print(f"DAMAGED shard {item['shard']}: {item['message']}")
        else:
            local = f"{item['shard']} record {item['local']}"
            print(f"DAMAGED record {item['index']} ({local}): {item['message']}")
    for shard in report["shards"]:
        print(f"  {shard['name']}  {shard['records']} records  {shard['state']}")
    verdict = "damaged" if report["damaged"] else "ok"
    print(
        f"{verdict}: {len(report['shards'])} shards, {report['records']} records: "
        f"{report['checked']} matched their checksum, {report['unchecked']} decoded without "
        f"one, {len(report['damaged'])} damaged"
    )


def compact(args: argparse.Namespace) -> int:
    path = Path(args.store)
    freed = 0
    with (
        writer_lock(path),
        Progress(None, f"compact {path.name}", show=not args.quiet) as bar,
    ):
        manifest = read_manifest(path)
        recover(path, manifest)  # what a stopped append left past the manifest goes first
        done = 0  # bytes of the shards compacted so far: one bar goes on across them

        def shard_progress(part: int, total: int, at: int) -> None:
            nonlocal done
            done = at + part
            bar.reached(done, at + total)

        for name, _ in manifest.shards:
            with RecordStore(path / name, mode="a") as store:
                freed += store.compact(progress=functools.partial(shard_progress, at=done))
    print(f"freed {_mib(freed)} over {len(manifest.shards)} shards; {manifest.records} records")
    return 0
