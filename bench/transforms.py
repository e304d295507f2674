"""Per-record transforms at multi-core speed: chute's threads and worker processes against
torch's DataLoader and Grain's, on JPEG bytes.

Workload: scikit-learn's digits, upscaled to 64x64 and JPEG-encoded (20000 records, the 1797
digits cycled), written once as bytes records (`chute.write_ragged`) that every contender
reads (torch's and Grain's data sources index the same `BytesDataset`). Per image: decode
(Pillow), a random 56x56 crop, a random flip; the "+python" workload adds a fixed amount of
pure-Python work calibrated to about 2 ms. Batch 128, 2 threads or 2 worker processes each:

* chute, threads: ``DataLoader(map=..., num_threads=2)``;
* chute, workers: ``DataLoader(map=..., workers=2)``;
* torch: ``DataLoader(dataset, batch_size=128, shuffle=True, num_workers=2,
  persistent_workers=True)``;
* Grain: ``DataLoader(operations=[RandomMapTransform, Batch], worker_count=2)``.

Each run is a process of its own; contenders take turns, round by round (medians). Reported:
images/s after the first batch, seconds to the first batch (from constructing the loader),
and cores used (CPU seconds of the process and its workers over wall seconds). Then the hand-
off: a no-op (no map) loader over the decoded images with ``workers=1`` against one thread,
per batch, against the gather alone.

    python bench/transforms.py [--rounds 2] [--plot]   # writes bench/results/transforms.md/.png
    python bench/transforms.py --tiny                  # a smoke run that writes nothing
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _augment
import numpy as np
from _child import report as report_result
from _child import spawn

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "transforms"
RESULTS = ROOT / "results"
BATCH = 128
CONTENDERS = ("chute, threads", "chute, 2 workers", "torch, 2 workers", "grain, 2 workers")
WORKLOADS = ("decode+crop+flip", "+2 ms python")


def write_images(root: Path, n: int) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    import chute

    digits = load_digits().images
    blobs, decoded = [], []
    for i in range(n):
        pixels = (digits[i % len(digits)] * (255 / 16)).astype(np.uint8)
        big = Image.fromarray(pixels).resize(
            (_augment.SIDE, _augment.SIDE), Image.Resampling.BICUBIC
        )
        out = io.BytesIO()
        big.save(out, format="JPEG", quality=90)
        blobs.append(out.getvalue())
        decoded.append(np.asarray(big))
    chute.write_ragged(root / "jpeg", blobs).close()
    chute.write_dataset(root / "pixels", np.stack(decoded), codec="raw").close()


def calibrate(target_s: float = 0.002) -> int:
    """Iterations of `_augment.python_work` that take about ``target_s`` here."""
    n = 20_000
    while True:
        t = time.perf_counter()
        _augment.python_work(n)
        took = time.perf_counter() - t
        if took > 0.02:
            return max(1, int(n * target_s / took))
        n *= 2


# -- one run, in a process of its own -------------------------------------------------------


def _tree_cpu() -> float:
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _loader(kind: str, path: str, extra: bool) -> Any:
    if kind.startswith("chute"):
        import chute

        fn = _augment.chute_python if extra else _augment.chute_plain
        workers = 2 if "workers" in kind else 0
        return chute.DataLoader({"jpeg": chute.BytesDataset(path)}, batch_size=BATCH, seed=0,
                                map=fn, workers=workers, num_threads=2)  # fmt: skip
    if kind.startswith("torch"):
        import torch

        ds = _augment.TorchImages(path, extra)
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                             persistent_workers=True, drop_last=True)  # fmt: skip
        return _endless(loader)
    import grain.python as pg
    from _augment_grain import GrainPlain, GrainPython
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags; no absl.app here
        flags.FLAGS.mark_as_parsed()

    source = _augment.GrainSource(path)
    sampler = pg.IndexSampler(len(source), pg.NoSharding(), shuffle=True, num_epochs=None,
                              seed=0)  # fmt: skip
    ops = [GrainPython() if extra else GrainPlain(), pg.Batch(BATCH, drop_remainder=True)]
    return iter(pg.DataLoader(data_source=source, sampler=sampler, operations=ops,
                              worker_count=2))  # fmt: skip


def _endless(loader: Any) -> Any:
    while True:
        yield from loader


def run_one(kind: str, path: str, extra: bool, batches: int) -> dict[str, float]:
    t0 = time.perf_counter()
    loader = _loader(kind, path, extra)
    first = next(loader)
    t1 = time.perf_counter()
    c1 = _tree_cpu()
    n = 0
    for _ in range(batches):
        batch = next(loader)
        n += len(batch["image"] if isinstance(batch, dict) else batch)
    t2 = time.perf_counter()
    cores = (_tree_cpu() - c1) / (t2 - t1)
    assert len(first["image"] if isinstance(first, dict) else first) == BATCH
    if hasattr(loader, "close"):
        loader.close()
    return {"images_s": n / (t2 - t1), "first_s": t1 - t0, "cores": cores}


def hand_off(path: str, batches: int) -> dict[str, float]:
    """Per-batch seconds: the gather alone (calling thread), a one-thread loader and a
    one-worker loader, no map (what the worker hand-over adds)."""
    import chute

    ds = chute.Dataset(path, num_threads=1)
    rng = np.random.default_rng(0)
    idx = [rng.integers(0, len(ds), BATCH) for _ in range(batches)]
    t = time.perf_counter()
    for i in idx:
        ds[i]
    alone = (time.perf_counter() - t) / batches
    out = {"gather_s": alone}
    for name, opts in (("thread_s", {"num_threads": 1}), ("worker_s", {"workers": 1})):
        with chute.DataLoader({"x": ds}, batch_size=BATCH, seed=0, **opts) as dl:
            for _ in range(20):
                next(dl)
            t = time.perf_counter()
            for _ in range(batches):
                next(dl)
            out[name] = (time.perf_counter() - t) / batches
    return out


def _child(args: argparse.Namespace) -> None:
    spec = json.loads(args.child)
    if spec["kind"] == "hand-off":
        result = hand_off(spec["path"], spec["batches"])
    else:
        result = run_one(spec["kind"], spec["path"], spec["extra"], spec["batches"])
    report_result(result)


# -- report ---------------------------------------------------------------------------------


def report(runs: dict[tuple[str, str], list[dict[str, float]]], off: dict[str, float],
           args: argparse.Namespace, loops: int) -> tuple[str, dict[str, Any]]:  # fmt: skip
    med = {key: {m: statistics.median(r[m] for r in rs) for m in rs[0]}
           for key, rs in runs.items() if rs}  # fmt: skip
    lines = [
        "# Per-record transforms: threads, worker processes, torch, Grain",
        "",
        f"{args.records} JPEG images (scikit-learn's digits upscaled to 64x64, cycled), read as "
        f"bytes records; per image: Pillow decode, random 56x56 crop, random flip; '+2 ms "
        f"python' adds {loops} iterations of pure-Python work (about 2 ms here). Batch {BATCH}, "
        f"2 threads or 2 worker processes; {args.batches} batches after the first, each run a "
        f"process of its own, medians of {args.rounds} interleaved rounds.",
        "",
        "| workload | contender | images/s | first batch s | cores used |",
        "|---|---|---:|---:|---:|",
    ]
    for w in WORKLOADS:
        for c in CONTENDERS:
            r = med.get((w, c))
            if r is None:
                lines.append(f"| {w} | {c} | failed | | |")
                continue
            lines.append(f"| {w} | {c} | {r['images_s']:.0f} | {r['first_s']:.2f} "
                         f"| {r['cores']:.2f} |")  # fmt: skip
    checks = []
    for w in WORKLOADS:
        ours = med.get((w, "chute, 2 workers"), {}).get("images_s")
        for peer in ("torch, 2 workers", "grain, 2 workers"):
            theirs = med.get((w, peer), {}).get("images_s")
            if ours and theirs:
                checks.append((f"{w}: chute workers vs {peer.split(',')[0]}", ours / theirs, 1.1))
    py = WORKLOADS[1]
    threads, ours = (med.get((py, c), {}).get("images_s") for c in CONTENDERS[:2])
    if ours and threads:
        checks.append((f"{py}: chute workers vs chute threads", ours / threads, 1.7))
    first = med.get((WORKLOADS[0], "chute, 2 workers"), {}).get("first_s")
    torch_first = med.get((WORKLOADS[0], "torch, 2 workers"), {}).get("first_s")
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for label, value, goal in checks:
        lines.append(
            f"| {label} | {value:.2f}x | >= {goal}x | {'yes' if value >= goal else 'no'} |"
        )
    if first and torch_first:
        ok = first <= torch_first
        lines.append(f"| time to first batch, chute workers vs torch | {first:.2f} s vs "
                     f"{torch_first:.2f} s | no worse | {'yes' if ok else 'no'} |")  # fmt: skip
    if off:
        share = (off["worker_s"] - off["thread_s"]) / off["gather_s"]
        lines.append(f"| worker hand-off per batch (no map), over the gather alone | "
                     f"{share:.1%} | <= 5% | {'yes' if share <= 0.05 else 'no'} |")  # fmt: skip
        lines += ["", f"Hand-off, per batch of {BATCH} decoded 64x64 images (raw): the gather "
                  f"alone {1e3 * off['gather_s']:.3f} ms, a one-thread loader "
                  f"{1e3 * off['thread_s']:.3f} ms, a one-worker loader "
                  f"{1e3 * off['worker_s']:.3f} ms."]  # fmt: skip
    return "\n".join(lines) + "\n", med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--plot", action="store_true")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    if args.tiny:
        args.records, args.batches, args.rounds = 2000, 4, 1
    loops = calibrate()
    env = {**os.environ, _augment.LOOPS_VAR: str(loops)}
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        root = Path(tmp)
        write_images(root, args.records)
        runs: dict[tuple[str, str], list[dict[str, float]]] = {
            (w, c): [] for w in WORKLOADS for c in CONTENDERS
        }
        for r in range(args.rounds):
            order = CONTENDERS[r % 4 :] + CONTENDERS[: r % 4]
            for w in WORKLOADS:
                for c in order:
                    print(f"round {r + 1}: {w}, {c}", file=sys.stderr)
                    spec = {"kind": c, "path": str(root / "jpeg"), "extra": w != WORKLOADS[0],
                            "batches": args.batches}  # fmt: skip
                    got = spawn(__file__, spec, env)
                    if isinstance(got, str):
                        print(f"  {got}", file=sys.stderr)
                    else:
                        runs[(w, c)].append(got)
        spec = {"kind": "hand-off", "path": str(root / "pixels"), "batches": 400}
        off = spawn(__file__, spec, env)
    text, med = report(runs, off if isinstance(off, dict) else {}, args, loops)
    print(text)
    if args.tiny:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "transforms.md").write_text(text)
    if args.plot:
        from _charts import ratio_chart

        names = list(CONTENDERS)
        metrics = {w: [med.get((w, c), {}).get("images_s", 0.0) for c in names]
                   for w in WORKLOADS}  # fmt: skip
        ratio_chart(RESULTS / "transforms.png", "Per-record transforms: images/s", names,
                    metrics)  # fmt: skip


if __name__ == "__main__":
    main()
