"""An image pipeline: JPEG bytes on disk, decoded and augmented in worker processes, a
training loop that checkpoints, dies and resumes exactly.

Run with ``python examples/images_resume.py`` (needs Pillow and scikit-learn). Encodes
scikit-learn's digits as 32x32 JPEGs, writes them as bytes records (`chute.write_ragged`)
beside their labels, then trains a stand-in model (a running checksum of the batches it saw)
with ``workers=2`` processes that decode each JPEG, crop it at random and flip it at random.
The map asks for ``rng``: its generator is a pure function of (seed, step, position), so a
run that crashes at step 13 and resumes from its checkpoint at step 10 sees exactly the
batches (augmentations included) of an uninterrupted run, and so does one with threads.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

import chute

STEPS, EVERY, CRASH_AT, SIDE, CROP = 20, 5, 13, 32, 28


def write_images(root: Path) -> None:
    """scikit-learn's digits as JPEG bytes, and their labels."""
    digits = load_digits()
    blobs = []
    for image in digits.images[:400]:
        pixels = (image * (255 / 16)).astype(np.uint8)
        big = Image.fromarray(pixels).resize((SIDE, SIDE), Image.Resampling.BILINEAR)
        out = io.BytesIO()
        big.save(out, format="JPEG", quality=90)
        blobs.append(out.getvalue())
    chute.write_ragged(root / "jpeg", blobs, shard_records=100).close()
    chute.write_dataset(root / "label", digits.target[:400].astype(np.int64)).close()


def augment(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Decode one JPEG, crop CROP x CROP at random, flip at random (in a worker process)."""
    pixels = np.asarray(Image.open(io.BytesIO(record["jpeg"])).convert("L"))
    top, left = (int(v) for v in rng.integers(0, SIDE - CROP + 1, size=2))
    crop = pixels[top : top + CROP, left : left + CROP]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return {"image": crop.astype(np.float32) / 255, "label": record["label"]}


def train(root: Path, crash_at: int | None, workers: int) -> list[float]:
    """Train to STEPS, resuming from root/ckpt.json if there is one; returns what was seen."""
    streams = {"jpeg": chute.BytesDataset(root / "jpeg"), "label": chute.Dataset(root / "label")}
    ckpt = root / "ckpt.json"
    seen: list[float] = []
    with chute.DataLoader(streams, batch_size=32, seed=11, map=augment, workers=workers) as dl:
        if ckpt.exists():
            saved = json.loads(ckpt.read_text())
            dl.load_state_dict(saved["loader"])
            seen = saved["seen"]
        while dl.step < STEPS:
            if dl.step == crash_at:
                raise RuntimeError(f"crashed at step {crash_at}")
            batch = next(dl)
            assert batch["image"].shape == (32, CROP, CROP)
            seen.append(round(float(batch["image"].sum() + batch["label"].sum()), 3))
            if dl.step % EVERY == 0:
                ckpt.write_text(json.dumps({"loader": dl.state_dict(), "seen": seen}))
    return seen


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_images(root)
        uninterrupted = train(root, None, workers=2)
        (root / "ckpt.json").unlink()
        try:
            train(root, CRASH_AT, workers=2)
        except RuntimeError as e:
            print(e)
        resumed = train(root, None, workers=2)
        (root / "ckpt.json").unlink()
        threads = train(root, None, workers=0)
    assert resumed == uninterrupted, "the resumed run saw other batches"
    assert threads == uninterrupted, "threads and worker processes built other batches"
    print(f"{STEPS} steps, resumed at step {CRASH_AT // EVERY * EVERY}: the same batches")


if __name__ == "__main__":
    main()
