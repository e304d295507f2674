"""Train on one split, evaluate on the other, log both by step, stop, and resume exactly.

Run with ``python examples/train_val.py``. One store holds all samples; ``chute.split``
holds out 10% for validation without copying anything. Training draws class-balanced
batches (a `WeightedSampler` over the training subset); every 25 steps a finite evaluation
pass visits each validation sample exactly once (padded, with a mask, so every batch has
one shape). Loss and accuracy go to a metric run at the loader's step. The run stops at
step 60, resumes from its checkpoint, and checks that the resumed run logged every step
exactly once and drew the batches of an uninterrupted run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

import chute
from chute.metrics import DirectWriter, Reader

N, STEPS, EVAL_EVERY, STOP_AT = 2000, 100, 25, 60


def make_data(root: Path) -> None:
    rng = np.random.default_rng(0)
    labels = (rng.random(N) < 0.1).astype(np.int64)  # 10% positives: imbalanced
    signal = rng.normal(labels[:, None] * 1.5, 1.0, (N, 7))
    features = np.hstack([signal, np.ones((N, 1))]).astype(np.float32)  # last column: bias
    chute.write_dataset(root / "features.zr", features).close()
    chute.write_dataset(root / "labels.zr", labels).close()


def run(root: Path, stop_at: int | None) -> list[int]:
    """Train to STEPS (or stop_at), resuming from root/ckpt.json; returns the sums drawn."""
    streams = {"x": chute.Dataset(root / "features.zr"), "y": chute.Dataset(root / "labels.zr")}
    train, val = chute.split(N, [0.9, 0.1], seed=0)
    labels = streams["y"][train]
    balance = 1.0 / np.bincount(labels)[labels]  # each class drawn equally often
    sampler = chute.WeightedSampler(balance, batch_size=64, seed=1)
    w = np.zeros(8, np.float32)
    drawn: list[int] = []
    ckpt = root / "ckpt.json"
    with chute.DataLoader(streams, sampler=sampler, indices=train, num_threads=2) as loader:
        if ckpt.exists():
            saved = json.loads(ckpt.read_text())
            loader.load_state_dict(saved["loader"])
            w, drawn = np.array(saved["w"], np.float32), saved["drawn"]
        # The writer's step is the step of the batch the loader hands out next: one line-up.
        metrics = DirectWriter(root / "run", step=loader.step)
        for batch in loader:  # batch of step loader.step - 1
            step = loader.step - 1
            assert metrics.step == step
            logits = batch["x"] @ w
            grad = batch["x"].T @ (1 / (1 + np.exp(-logits)) - batch["y"]) / len(logits)
            w -= 0.5 * grad.astype(np.float32)
            drawn.append(int(batch["y"].sum()))
            metrics.write(loss=float(np.abs(grad).sum()))
            if loader.step % EVAL_EVERY == 0:
                correct = seen = 0
                with chute.iterate(streams, 128, indices=val, last="pad", num_threads=2) as passes:
                    for vb in passes:  # every validation sample once, one batch shape
                        hit = ((vb["x"] @ w > 0) == vb["y"].astype(bool)) & vb["mask"]
                        correct += int(hit.sum())
                        seen += int(vb["mask"].sum())
                assert seen == len(val)
                metrics.write(val_accuracy=correct / seen)
            metrics.end_step()
            if loader.step in (stop_at, STEPS):
                state = {"loader": loader.state_dict(), "w": w.tolist(), "drawn": drawn}
                ckpt.write_text(json.dumps(state))
                metrics.close()
                return drawn
    raise AssertionError("the loader is endless")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_data(root)
        (root / "whole").mkdir()
        make_data(root / "whole")
        whole = run(root / "whole", stop_at=None)
        run(root, stop_at=STOP_AT)
        resumed = run(root, stop_at=None)
        assert resumed == whole, "the resumed run drew other batches"
        with Reader(root / "run") as reader:
            steps, _ = reader.metric("loss")
            val_steps, accuracy = reader.metric("val_accuracy")
        assert steps.tolist() == list(range(STEPS)), "a step was lost or logged twice"
        assert val_steps.tolist() == list(range(EVAL_EVERY - 1, STEPS, EVAL_EVERY))
        balance = sum(whole) / (64 * STEPS)
        print(f"{STEPS} steps, resumed at {STOP_AT}: identical; positives per batch {balance:.2f}")
        curve = ", ".join(f"{s}: {a:.3f}" for s, a in zip(val_steps, accuracy, strict=True))
        print(f"validation accuracy by step: {curve}")


if __name__ == "__main__":
    main()
