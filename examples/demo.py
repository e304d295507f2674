"""chute's front-door demo: one training run on real data, end to end.

``make demo`` runs it. On scikit-learn's bundled handwritten digits (1797 images of 8x8,
10 classes, shipped inside the package, no download) it

1. converts the images (``zstd_dict``) and the labels to chute stores and compares their
   size with ``.npy``;
2. trains a one-hidden-layer numpy MLP from the endless ``DataLoader`` (cyclic sampler,
   a train/val split by index), logging loss, val accuracy, learning rate and wall time
   with a ``CompactingWriter``;
3. is pre-empted for real: the training runs in a child process that the demo kills with
   SIGKILL part way, then restarts from its last checkpoint (weights + ``state_dict()`` of
   the loader; the metric writer resumes at the same step), and checks the resumed run's
   metrics equal those of an uninterrupted run, step for step;
4. writes the same images as a Zarr v3 array and evaluates the model on the val split
   streamed through ``chute.insitu``, checking the accuracy equals the one from the store;
5. plots loss and accuracy with ``chute metrics plot`` and prints a summary table.

Everything goes under ``--out`` (default ``demo_out/``, git-ignored). ``--quick`` is the
shortened form the test suite runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import chute
from chute.insitu import InSituDataset, SplitManifest
from chute.metrics import CompactingWriter, Reader

SEED = 0
BATCH = 64
HIDDEN = 64
CHUNK = 32  # images per Zarr chunk; the split is by whole chunks, so both readers agree
EVAL_EVERY = 50
CKPT_EVERY = 100
COMPARED = ("loss", "lr", "val_acc")  # deterministic metrics (walltime is not)


# -- data -----------------------------------------------------------------------------------


def split(n: int) -> SplitManifest:
    """80/20 train/val by chunks of CHUNK images, assigned at random from SEED."""
    n_chunks = math.ceil(n / CHUNK)
    order = np.random.default_rng(SEED).permutation(n_chunks)
    n_val = round(0.2 * n_chunks)
    chunks = {
        "train": tuple(sorted(order[n_val:].tolist())),
        "val": tuple(sorted(order[:n_val].tolist())),
    }
    return SplitManifest(n_chunks=n_chunks, sample_chunk_size=CHUNK, n_samples=n, chunks=chunks)


def du(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def convert(out: Path) -> dict[str, int]:
    """Step 1: the digits as .npy files and as chute stores; returns bytes on disk."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.uint8)  # (1797, 8, 8), gray levels 0..16
    labels = digits.target.astype(np.int8)
    np.save(out / "images.npy", images)
    np.save(out / "labels.npy", labels)
    chute.write_dataset(out / "images.zr", images, codec="zstd_dict", dict_size=4096).close()
    chute.write_dataset(out / "labels.zr", labels, codec="zstd").close()
    with chute.Dataset(out / "images.zr") as ds, chute.Dataset(out / "labels.zr") as lab:
        assert np.array_equal(ds[:], images) and np.array_equal(lab[:], labels)
        records = ds.store.stats()
    sizes = {
        name: du(out / name) for name in ("images.npy", "labels.npy", "images.zr", "labels.zr")
    }
    print(f"\n[1] converted {len(images)} digit images {images.shape[1:]} {images.dtype} + labels")
    print(f"    {'file':11s} {'on disk':>8s} {'records':>8s} {'index':>7s}  vs .npy")
    for kind in ("images", "labels"):
        npy, zr = sizes[f"{kind}.npy"], sizes[f"{kind}.zr"]
        index = sum(du(out / f"{kind}.zr" / f) for f in ("meta.zr", "crc32c.chute", "schema.json"))
        data = zr - index
        print(f"    {kind + '.npy':11s} {npy:8,d}")
        print(
            f"    {kind + '.zr':11s} {zr:8,d} {data:8,d} {index:7,d}  {npy / zr:.2f}x smaller "
            f"({npy / data:.2f}x without the index)"
        )
    print(
        f"    image records: {records['logical_bytes']:,d} -> {records['live_bytes']:,d} bytes "
        f"({records['ratio']:.2f}x, trained dictionary), read back identical.\n    At "
        f"{images[0].nbytes} bytes a record, the index (a 16-byte table entry and a 16-byte "
        "checksum per record) outweighs what compression saves;\n    for records of a few KiB "
        "it is about 1% or less."
    )
    return sizes


# -- the model: a one-hidden-layer MLP trained with SGD + momentum --------------------------


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {
        "w1": rng.normal(0, math.sqrt(2 / 64), (64, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(0, math.sqrt(1 / HIDDEN), (HIDDEN, 10)),
        "b2": np.zeros(10),
    }


def forward(
    p: dict[str, np.ndarray], images: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = images.reshape(len(images), -1).astype(np.float64) / 16.0
    h = np.maximum(x @ p["w1"] + p["b1"], 0.0)
    return x, h, h @ p["w2"] + p["b2"]


def predict(p: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    return forward(p, images)[2].argmax(axis=1)


def sgd_step(
    p: dict[str, np.ndarray],
    v: dict[str, np.ndarray],
    images: np.ndarray,
    labels: np.ndarray,
    lr: float,
) -> float:
    """One step of softmax cross-entropy; updates ``p`` and the momentum ``v`` in place."""
    x, h, logits = forward(p, images)
    logits -= logits.max(axis=1, keepdims=True)
    prob = np.exp(logits)
    prob /= prob.sum(axis=1, keepdims=True)
    n = len(labels)
    loss = float(-np.log(prob[np.arange(n), labels] + 1e-12).mean())
    d = prob
    d[np.arange(n), labels] -= 1.0
    d /= n
    grads = {"w2": h.T @ d, "b2": d.sum(0)}
    dh = (d @ p["w2"].T) * (h > 0)
    grads.update(w1=x.T @ dh, b1=dh.sum(0))
    for k, g in grads.items():
        v[k] = 0.9 * v[k] + g + 1e-4 * p[k]
        p[k] -= lr * v[k]
    return loss


def lr_at(step: int, steps: int) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to zero."""
    warm = max(1, steps // 20)
    if step < warm:
        return 0.2 * (step + 1) / warm
    return 0.1 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


# -- training (runs in a child process) -----------------------------------------------------


def save_checkpoint(
    path: Path, step: int, p: dict, v: dict, loader: chute.DataLoader, wall: float
) -> None:
    """Weights, momentum, loader state and wall-time offset, replaced atomically."""
    tmp = path.with_suffix(".tmp.npz")
    arrays = {f"p_{k}": a for k, a in p.items()} | {f"v_{k}": a for k, a in v.items()}
    state = json.dumps({"step": step, "loader": loader.state_dict(), "walltime": wall})
    np.savez(tmp, state=np.array(state), **arrays)
    os.replace(tmp, path)


def train(out: Path, run: Path, steps: int) -> None:
    """Train to ``steps``, resuming from run/ckpt.npz if it exists; prints each step done."""
    manifest = split(len(chute.Dataset(out / "labels.zr")))
    train_idx, val_idx = manifest.sample_indices("train"), manifest.sample_indices("val")
    images, labels = chute.Dataset(out / "images.zr"), chute.Dataset(out / "labels.zr")
    val_x, val_y = images[val_idx], labels[val_idx]
    streams = {"image": images, "label": labels}
    ckpt = run / "ckpt.npz"
    p, v = init_params(), {k: np.zeros_like(a) for k, a in init_params().items()}
    start, wall0 = 0, 0.0
    loader = chute.DataLoader(
        streams, batch_size=BATCH, sampler="cyclic", seed=SEED, indices=train_idx
    )  # the train split by index: the sampler draws from these records only
    with loader:
        if ckpt.exists():
            saved = np.load(ckpt)
            state = json.loads(str(saved["state"]))
            p = {k: saved[f"p_{k}"] for k in p}
            v = {k: saved[f"v_{k}"] for k in v}
            loader.load_state_dict(state["loader"])
            start, wall0 = state["step"], state["walltime"]
        config = {"batch_size": BATCH, "hidden": HIDDEN, "steps": steps, "seed": SEED}
        log = CompactingWriter(run / "metrics", step=start, hotsize=50, config=config)
        t0 = time.perf_counter() - wall0
        for step in range(start, steps):
            if step % CKPT_EVERY == 0:
                save_checkpoint(ckpt, step, p, v, loader, time.perf_counter() - t0)
            batch = next(loader)
            lr = lr_at(step, steps)
            loss = sgd_step(p, v, batch["image"], batch["label"].astype(np.int64), lr)
            log.write(loss=loss, lr=lr, walltime=time.perf_counter() - t0)
            if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
                log.write(val_acc=float((predict(p, val_x) == val_y).mean()))
            log.end_step()
            print(step + 1, flush=True)
        log.finish()
    np.savez(run / "model.npz", **p)


def run_child(out: Path, run: Path, steps: int, desc: str, kill_at: int | None = None) -> int:
    """Run ``train`` in a child process with a progress bar; SIGKILL it at ``kill_at``.

    Returns the last step the child reported done.
    """
    cmd = [sys.executable, __file__, "--out", str(out), "--child", str(run), "--steps", str(steps)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    done = start_of(run)
    with tqdm(total=steps, initial=done, desc=f"    {desc}", unit="step", leave=False) as bar:
        for line in child.stdout:
            step = int(line)
            bar.update(step - done)
            done = step
            if kill_at is not None and step >= kill_at:
                os.kill(child.pid, signal.SIGKILL)
                break
    rc = child.wait()
    if kill_at is None and rc != 0:
        raise SystemExit(f"training child failed with exit code {rc}")
    if kill_at is not None and rc != -signal.SIGKILL:
        raise SystemExit(f"the child ended (exit {rc}) before it could be killed at step {kill_at}")
    return done


def start_of(run: Path) -> int:
    """The step a run resumes from (0 without a checkpoint)."""
    ckpt = run / "ckpt.npz"
    if not ckpt.exists():
        return 0
    return int(json.loads(str(np.load(ckpt)["state"]))["step"])


def preempt_and_resume(out: Path, steps: int) -> dict[str, Any]:
    """Steps 2 and 3: an interrupted run and an uninterrupted one, compared step by step."""
    manifest = split(len(np.load(out / "labels.npy")))
    n_train, n_val = len(manifest.sample_indices("train")), len(manifest.sample_indices("val"))
    print(
        f"\n[2] training a 64-{HIDDEN}-10 MLP for {steps} steps of {BATCH} from the endless "
        f"DataLoader (cyclic sampler; split by index: {n_train} train / {n_val} val images)"
    )
    kill_at = steps * 2 // 5 + CKPT_EVERY // 2 - 7  # well past a checkpoint, well before the next
    run, ref = out / "run", out / "run-uninterrupted"
    t0 = time.perf_counter()
    killed = run_child(out, run, steps, "run (to be killed)", kill_at=kill_at)
    resume = start_of(run)
    print(
        f"[3] SIGKILLed the training process as it reported step {killed}; its last checkpoint "
        f"is at step {resume}: restarting from it (weights + loader.state_dict(), metrics cut at "
        f"step {resume})"
    )
    run_child(out, run, steps, f"resumed from step {resume}")
    interrupted_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_child(out, ref, steps, "uninterrupted run")
    straight_s = time.perf_counter() - t0
    with Reader(run / "metrics") as a, Reader(ref / "metrics") as b:
        for name in COMPARED:
            (sa, va), (sb, vb) = a.metric(name), b.metric(name)
            if not (np.array_equal(sa, sb) and np.array_equal(va, vb)):
                raise SystemExit(f"the resumed run's {name!r} differs from the uninterrupted run's")
        steps_logged, acc = a.metric("val_acc")
        _, wall = b.metric("walltime")
        rows = {name: len(a.metric(name)[0]) for name in COMPARED}
    print(
        "    resumed run == uninterrupted run, step for step: "
        + ", ".join(f"{name} ({n} rows)" for name, n in rows.items())
    )
    print(f"    val accuracy every {EVAL_EVERY} steps: " + " ".join(f"{x:.2f}" for x in acc))
    final = float(acc[-1])
    if final < 0.9:
        raise SystemExit(f"val accuracy {final:.3f} is below 0.90")
    return {
        "steps": int(steps_logged[-1]) + 1,
        "val_acc": final,
        "killed_at": killed,
        "resumed_from": resume,
        "train_s": float(wall[-1]),
        "straight_s": straight_s,
        "interrupted_s": interrupted_s,
    }


# -- the same images in place, from Zarr ----------------------------------------------------


def insitu_eval(out: Path, logged_acc: float) -> float:
    """Step 4: the images as a Zarr v3 array; the val split streamed through chute.insitu."""
    import zarr

    images, labels = np.load(out / "images.npy"), np.load(out / "labels.npy")
    root = zarr.open_group(out / "digits.zarr", mode="w", zarr_format=3)
    for name, data in (("images", images), ("labels", labels)):
        arr = root.create_array(
            name, shape=data.shape, dtype=data.dtype, chunks=(CHUNK, *data.shape[1:])
        )
        arr[:] = data
    model = np.load(out / "run" / "model.npz")
    p = {k: model[k] for k in model.files}
    manifest = split(len(images))
    val_idx = manifest.sample_indices("val")
    with chute.Dataset(out / "images.zr") as ds, chute.Dataset(out / "labels.zr") as lab:
        store_pred, store_y = predict(p, ds[val_idx]), lab[val_idx]
    store_acc = float((store_pred == store_y).mean())
    by_index = dict(zip(val_idx.tolist(), store_pred.tolist(), strict=True))
    correct = seen = 0
    zds = InSituDataset(out / "digits.zarr", manifest, batch_size=128)
    bar = tqdm(total=zds.val.n_samples, desc="    insitu val", unit="img", leave=False)
    with zds, bar:
        for batch in zds.val:
            pred = predict(p, batch["images"])
            for i, y in zip(batch["sample_indices"].tolist(), pred.tolist(), strict=True):
                if by_index.pop(i) != y:
                    raise SystemExit(f"image {i}: the Zarr copy's prediction differs")
            correct += int((pred == batch["labels"]).sum())
            seen += len(pred)
            bar.update(len(pred))
    acc = correct / seen
    print(
        f"\n[4] wrote the images as a Zarr v3 array ({du(out / 'digits.zarr'):,d} bytes, chunks "
        f"of {CHUNK}); streamed its val split through chute.insitu: {seen} images, accuracy "
        f"{acc:.4f} (from the store: {store_acc:.4f}; logged at the last step: {logged_acc:.4f})\n"
        f"    Zarr compresses {CHUNK} images per chunk together; chute compresses each record "
        "on its own, so that any one record reads alone."
    )
    if by_index or acc != store_acc or np.float32(acc) != np.float32(logged_acc):
        raise SystemExit("the Zarr val split or its accuracy differs from the store's")
    return acc


def plot(out: Path) -> Path:
    """Step 5: loss, val accuracy and lr curves through the ``chute metrics plot`` command."""
    png = out / "training.png"
    cmd = [sys.executable, "-m", "chute", "metrics", "plot", str(out / "run" / "metrics")]
    subprocess.run(
        [*cmd, "loss", "val_acc", "lr", "-o", str(png)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_out"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="a shorter run (the test's)")
    parser.add_argument("--steps", type=int, default=None, help="training steps")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (300 if args.quick else 1000)
    if args.child is not None:
        train(args.out, args.child, steps)
        return
    t0 = time.perf_counter()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    sizes = convert(args.out)
    result = preempt_and_resume(args.out, steps)
    zarr_acc = insitu_eval(args.out, result["val_acc"])
    png = plot(args.out)
    print(f"\n[5] plotted loss, val_acc and lr with `chute metrics plot`: {png}")
    metrics_bytes = du(args.out / "run" / "metrics")
    rows = [
        ("training steps", f"{result['steps']} (batch {BATCH})"),
        (
            "pre-empted",
            f"SIGKILL after step {result['killed_at']}, resumed from {result['resumed_from']}",
        ),
        ("val accuracy (store / Zarr)", f"{result['val_acc']:.4f} / {zarr_acc:.4f}"),
        (
            "throughput",
            f"{result['steps'] / result['train_s']:,.0f} steps/s, "
            f"{result['steps'] * BATCH / result['train_s']:,.0f} images/s "
            "(the uninterrupted run: loader + numpy MLP)",
        ),
        (
            "images on disk",
            f".npy {sizes['images.npy']:,d} B, chute {sizes['images.zr']:,d} B, "
            f"Zarr {du(args.out / 'digits.zarr'):,d} B",
        ),
        ("metric run", f"{args.out / 'run' / 'metrics'} ({metrics_bytes:,d} B)"),
        ("plot", str(png)),
        ("demo wall time", f"{time.perf_counter() - t0:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nsummary")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    run = args.out / "run" / "metrics"
    print(f"\ntry: chute metrics ls {run}; chute info {args.out / 'images.zr'}")


if __name__ == "__main__":
    main()
