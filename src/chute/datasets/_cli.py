"""``chute info``, ``verify`` and ``compact`` over a sharded dataset: per shard and in total."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from chute._util.progress import Progress
from chute.datasets._sharded_manifest import read_manifest
from chute.datasets._sharded_store import ShardedStore
from chute.datasets._sharded_write import recover, writer_lock
from chute.errors import ChuteError
from chute.store import RecordStore


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def info_report(path: Path) -> dict[str, Any]:
    """`RecordStore.stats` summed over the shards, with each shard's own and the schema."""
    with ShardedStore(path) as store:
        m = store.manifest
        stats = store.stats()
    schema = m.schema
    stats["schema"] = {
        "kind": "ragged" if schema.get("ragged") else "fixed",
        "dtype": str(schema["dtype"]),
        "shape": list(schema.get("item_shape", schema.get("shape", ()))),
    }
    stats["shard_records"] = m.shard_records
    stats["shard_names"] = [name for name, _ in m.shards]
    return stats


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


def verify_report(path: Path, quiet: bool) -> dict[str, Any]:
    """Check the manifest, then every shard's length and records; damage never stops it.
    Damaged records are named by their global index and their shard."""
    manifest = read_manifest(path)
    damaged: list[dict[str, Any]] = []
    shards: list[dict[str, Any]] = []
    checked = unchecked = 0
    starts = manifest.starts()
    with ShardedStore(path) as store, Progress(None, f"verify {path.name}", show=not quiet) as bar:
        base = 0  # bytes of the shards already verified: one bar over the whole dataset
        for i, (name, n) in enumerate(manifest.shards):
            start = int(starts[i])

            def moved(done: int, total: int, base: int = base) -> None:
                bar.reached(base + done, base + total)

            try:
                report = store.shard(i).verify(progress=moved)
                base += int(store.shard(i).stats()["logical_bytes"])
            except ChuteError as e:
                damaged.append({"index": None, "shard": name, "message": str(e)})
                shards.append({"name": name, "records": n, "state": "damaged"})
                continue
            for local, message in report["damaged"]:
                damaged.append(
                    {"index": start + local, "shard": name, "local": local, "message": message}
                )
            checked += report["checked"]
            unchecked += report["unchecked"]
            state = "damaged" if report["damaged"] else "ok"
            shards.append({"name": name, "records": n, "state": state})
    return {
        "records": manifest.records,
        "checked": checked,
        "unchecked": unchecked,
        "damaged": damaged,
        "shards": shards,
        "has_checksums": True,
    }


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
    with writer_lock(path):
        manifest = read_manifest(path)
        recover(path, manifest)  # what a stopped append left past the manifest goes first
        for name, _ in manifest.shards:
            with RecordStore(path / name, mode="a") as store:
                freed += store.compact()
    print(f"freed {_mib(freed)} over {len(manifest.shards)} shards; {manifest.records} records")
    return 0
