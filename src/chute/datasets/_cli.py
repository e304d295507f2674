"""``chute info``, ``verify`` and ``compact`` over a sharded dataset: per shard and in total."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from chute.datasets._manifest import read_manifest
from chute.datasets._store import ShardedStore
from chute.datasets._write import recover, writer_lock
from chute.errors import ChuteError
from chute.store import RecordStore


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def info(args: argparse.Namespace) -> int:
    with ShardedStore(args.store) as store:
        m = store.manifest
        stats = store.stats()
    schema = m.schema
    kind = "ragged" if schema.get("ragged") else "fixed"
    shape = schema.get("item_shape", schema.get("shape", ()))
    print(f"sharded:   {len(m.shards)} shards of at most {m.shard_records} records")
    print(f"schema:    {kind}, dtype {schema['dtype']}, record shape {tuple(shape)}")
    for (name, n), s in zip(m.shards, stats["shards"], strict=True):
        print(
            f"  {name}  {n:>10} records  {_mib(s['live_bytes']):>12} stored  "
            f"ratio {s['ratio']:.2f}x  garbage {_mib(s['reclaimable'])}"
        )
    codecs = ", ".join(f"{k} {v}" for k, v in stats["codecs"].items())
    print(f"records:   {stats['records']}")
    print(f"codecs:    {codecs}")
    print(f"logical:   {_mib(stats['logical_bytes'])}")
    print(f"stored:    {_mib(stats['live_bytes'])} (ratio {stats['ratio']:.2f}x)")
    print(f"garbage:   {_mib(stats['reclaimable'])} reclaimable by `chute compact`")
    print(f"checksums: {'yes' if stats['has_checksums'] else 'no (written by another tool)'}")
    return 0


def verify(args: argparse.Namespace) -> int:
    """Check the manifest, then every shard's length and records; damage never stops it."""
    path = Path(args.store)
    manifest = read_manifest(path)
    problems = 0
    checked = total = 0
    starts = manifest.starts()
    with ShardedStore(path) as store:
        for i, (name, n) in enumerate(manifest.shards):
            start = int(starts[i])
            try:
                report = store.shard(i).verify()
            except ChuteError as e:
                print(f"DAMAGED shard {name}: {e}")
                problems += 1
                continue
            for local, message in report["damaged"]:
                print(f"DAMAGED record {start + local} ({name} record {local}): {message}")
            problems += len(report["damaged"])
            checked += report["records"] - report["unchecked"]
            total += n
            state = "damaged" if report["damaged"] else "ok"
            print(f"  {name}  {n} records  {state}")
    verdict = "damaged" if problems else "ok"
    print(
        f"{verdict}: {len(manifest.shards)} shards, {total} records decoded, "
        f"{checked} checksums matched, {problems} damaged"
    )
    return 1 if problems else 0


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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": info,
    "verify": verify,
    "compact": compact,
}
