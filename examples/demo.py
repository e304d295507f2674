"""chute's front-door demo: write image-like data to stores, read random batches back, then
run a short training loop on the step loader that logs metrics, stops, and resumes exactly.

Run with ``make demo``. Writes under ./demo_out (git-ignored) and prints what happened.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

import chute
from chute.metrics import CompactingWriter, Reader

OUT = Path("demo_out")


def make_images(n: int, seed: int = 0) -> np.ndarray:
    """Smooth per-sample waves plus noise, shaped like small RGB images (3, 64, 64)."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, 3 * 64 * 64, dtype=np.float32)
    amp = 1 + 4 * rng.random((n, 1), dtype=np.float32)
    phase = rng.random((n, 1), dtype=np.float32)
    wave = np.sin(2 * np.pi * (t * amp + phase)) * 0.5 + 0.5
    noisy = wave + rng.random((n, t.size), dtype=np.float32) * 0.06
    return (np.clip(noisy, 0, 1) * 255).astype(np.uint8).reshape(n, 3, 64, 64)


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    images = make_images(20_000)
    labels = np.random.default_rng(1).integers(0, 10, len(images)).astype(np.int32)
    np.save(OUT / "images.npy", images)
    print(f"source: {images.shape} {images.dtype}, {images.nbytes / 2**20:.0f} MiB, + labels")

    source = np.load(OUT / "images.npy", mmap_mode="r")  # streamed, never loaded whole
    for codec in ("raw", "zstd", "zstd_dict"):
        t0 = time.perf_counter()
        ds = chute.write_dataset(OUT / f"images-{codec}.zr", source, codec=codec)
        dt = time.perf_counter() - t0
        stats = ds.store.stats()
        print(
            f"write {codec:9s}: {images.nbytes / 2**20 / dt:7.0f} MiB/s, "
            f"{stats['live_bytes'] / 2**20:6.1f} MiB on disk (ratio {stats['ratio']:.2f}x)"
        )
    chute.write_dataset(OUT / "labels.zr", labels)

    ds = chute.Dataset(OUT / "images-zstd.zr")
    lab = chute.Dataset(OUT / "labels.zr")
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, len(ds), 256) for _ in range(200)]
    t0 = time.perf_counter()
    for idx in batches:
        x, y = ds[idx], lab[idx]
    dt = time.perf_counter() - t0
    mib_s = len(batches) * x.nbytes / 2**20 / dt
    print(
        f"read: {len(batches)} random batches of {x.shape} + labels {y.shape}: "
        f"{dt / len(batches) * 1e3:.2f} ms per batch, {mib_s:.0f} MiB/s"
    )
    assert np.array_equal(ds[batches[-1]], images[batches[-1]])
    assert np.array_equal(lab[batches[-1]], labels[batches[-1]])
    print("read back: identical to the source array")

    with chute.RecordStore(OUT / "images-zstd.zr", mode="a") as store:
        store.delete(np.arange(0, 20_000, 2))
        before = store.stats()["chunk_bytes"]
        freed = store.compact()
        report = store.verify()
        print(
            f"deleted half the records, compacted in place: {freed / 2**20:.1f} of "
            f"{before / 2**20:.1f} MiB freed; verify: {report['records']} records, "
            f"{len(report['damaged'])} damaged"
        )
    train_and_resume()
    print(f"try: .venv/bin/chute info {OUT / 'images-zstd_dict.zr'}")
    print(f"     .venv/bin/chute metrics ls {OUT / 'run'}")


def run(start: dict | None, steps: int) -> tuple[dict, list[float]]:
    """Train a stand-in model for ``steps`` steps from a loader state; log to demo_out/run."""
    streams = {
        "image": chute.Dataset(OUT / "images-zstd_dict.zr"),
        "label": chute.Dataset(OUT / "labels.zr"),
    }
    losses = []
    with chute.DataLoader(streams, batch_size=256, sampler="cyclic", seed=0) as loader:
        if start:
            loader.load_state_dict(start)
        log = CompactingWriter(OUT / "run", step=loader.step, hotsize=50, config={"batch": 256})
        with log:
            for _ in range(steps):
                batch = next(loader)
                loss = float(batch["image"].mean() / 255 + batch["label"].mean() / 100)
                log.write(loss=loss, images_seen=loader.step * 256)
                log.end_step()
                losses.append(loss)
        return loader.state_dict(), losses


def train_and_resume() -> None:
    t0 = time.perf_counter()
    state, first = run(None, 30)  # "crash" after 30 steps, keeping only the loader state
    _, rest = run(state, 30)
    _, straight = run(None, 60)  # the same 60 steps without the interruption
    dt = time.perf_counter() - t0
    assert first + rest == straight
    with Reader(OUT / "run") as r:
        steps, loss = r.metric("loss")
    print(
        f"trained 30 steps, stopped, resumed from the loader state for 30 more: the 60 losses "
        f"equal an uninterrupted run's ({dt:.1f} s for 120 steps of 256 images)"
    )
    print(f"metric log: {len(steps)} rows of 'loss', last at step {int(steps[-1])}: {loss[-1]:.4f}")


if __name__ == "__main__":
    main()
