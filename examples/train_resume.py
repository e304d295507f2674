"""A training loop on chute's step loader that checkpoints, dies, and resumes exactly.

Run with ``python examples/train_resume.py``. Writes small stores to a temporary folder,
trains a stand-in model (a running sum of the labels it saw) for 40 steps with a
checkpoint every 10, "crashes" at step 27, resumes from the last checkpoint, and checks
that the resumed run saw exactly the batches of an uninterrupted one.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import chute

STEPS, EVERY, CRASH_AT = 40, 10, 27


def collate(batch: dict[str, Any]) -> dict[str, Any]:
    tokens, lengths = chute.pad(*batch["tokens"], max_len=16)
    return {"tokens": tokens, "lengths": lengths, "label": batch["label"]}


def train(root: Path, crash_at: int | None) -> list[int]:
    """Train to STEPS, resuming from root/ckpt.json if present; returns the label sums seen."""
    streams = {
        "tokens": chute.RaggedDataset(root / "tokens.zr"),
        "label": chute.Dataset(root / "labels.zr"),
    }
    ckpt = root / "ckpt.json"
    seen: list[int] = []
    with chute.DataLoader(streams, batch_size=32, seed=7, transform=collate) as loader:
        if ckpt.exists():
            saved = json.loads(ckpt.read_text())
            loader.load_state_dict(saved["loader"])
            seen = saved["seen"]
        for batch in loader:
            seen.append(int(batch["label"].sum()))  # the "training step"
            if loader.step % EVERY == 0:
                ckpt.write_text(json.dumps({"loader": loader.state_dict(), "seen": seen}))
            if loader.step == crash_at:
                raise SystemExit(f"crashed at step {crash_at}")
            if loader.step == STEPS:
                return seen
    raise AssertionError("the loader is endless")


def main() -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seqs = [rng.integers(0, 1000, int(n)) for n in rng.integers(1, 17, 500)]
        chute.write_ragged(root / "tokens.zr", seqs).close()
        chute.write_dataset(root / "labels.zr", rng.integers(0, 10, 500).astype(np.int32)).close()
        try:
            train(root, crash_at=CRASH_AT)
        except SystemExit as stop:
            print(stop)
        resumed = train(root, crash_at=None)
        (root / "ckpt.json").unlink()
        uninterrupted = train(root, crash_at=None)
        assert resumed == uninterrupted, "the resumed run diverged"
        print(f"resumed from step {CRASH_AT // EVERY * EVERY}: {STEPS} steps identical")


if __name__ == "__main__":
    main()
