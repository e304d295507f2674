"""Language-model data end to end: a corpus to token datasets, packed sequences from three
sources mixed by weight (the weights change at step 8), a training loop that checkpoints,
crashes and resumes exactly, on one process or on two.

Run with ``python examples/llm_tokens.py``. The corpus is the standard library's ``.py``
files, tokenized at the byte level (a real run uses its tokenizer: any iterable of integer
arrays will do). The "model" is a stand-in: a running checksum of the batches it saw, so an
exact resume shows as equal checksums.
"""

from __future__ import annotations

import sysconfig
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

import chute

SEQ_LEN, BATCH, STEPS, EVERY, CRASH_AT = 256, 16, 20, 5, 13


def documents(files: list[Path]) -> Any:
    """One document per file, as byte-level tokens (uint16)."""
    for path in files:
        data = path.read_bytes()
        if data:
            yield np.frombuffer(data, np.uint8)


def write_corpus(root: Path) -> dict[str, chute.TokenDataset]:
    """Three sources: the top-level modules, the packages, the test suite."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*.py") if "site-packages" not in p.parts)[:600]
    parts = {
        "modules": [p for p in files if p.parent == lib],
        "packages": [p for p in files if p.parent != lib and "test" not in p.parts],
        "tests": [p for p in files if "test" in p.parts],
    }
    return {
        name: chute.write_tokens(root / name, documents(paths), shard_records=200)
        for name, paths in parts.items()
    }


def loader(
    corpus: dict[str, chute.TokenDataset], shard: tuple[int, int] | None = None
) -> chute.DataLoader:
    """Packed sequences of every source, mixed 50/30/20, then 20/30/50 from step 8."""
    sources = {name: chute.PackedTokens(ds, SEQ_LEN) for name, ds in corpus.items()}
    weights = {"modules": 0.5, "packages": 0.3, "tests": 0.2}
    later = {"modules": 0.2, "packages": 0.3, "tests": 0.5}
    mixture = chute.mix(sources, weights, schedule={8: later})
    return chute.DataLoader(mixture, batch_size=BATCH, seed=0, shard=shard)


def train(
    corpus: dict[str, chute.TokenDataset],
    checkpoint: dict[str, Any] | None,
    crash_at: int | None = None,
    processes: int = 1,
) -> tuple[int, dict[str, Any] | None, list[int]]:
    """Steps from ``checkpoint`` (or the start) to STEPS on ``processes`` simulated hosts;
    returns the checksum, the last checkpoint, and the tokens of each source seen."""
    loaders = [loader(corpus, (i, processes) if processes > 1 else None) for i in range(processes)]
    checksum, seen = 0, [0, 0, 0]
    if checkpoint is not None:
        for each in loaders:
            each.load_state_dict(checkpoint["loader"])
        checksum, seen = checkpoint["checksum"], list(checkpoint["seen"])
    try:
        while loaders[0].step < STEPS:
            if loaders[0].step == crash_at:
                return checksum, checkpoint, seen
            parts = [next(each) for each in loaders]  # every host its slice of the batch
            batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            inputs, targets = batch["tokens"][:, :-1], batch["tokens"][:, 1:]
            same = batch["segment_ids"][:, 1:] == batch["segment_ids"][:, :-1]
            checksum = zlib.crc32((inputs * same).tobytes() + targets.tobytes(), checksum)
            for source, count in enumerate(np.bincount(batch["source"], minlength=3)):
                seen[source] += int(count) * SEQ_LEN
            if loaders[0].step % EVERY == 0:
                state = loaders[0].state_dict()  # the same on every host
                checkpoint = {"loader": state, "checksum": checksum, "seen": list(seen)}
    finally:
        for each in loaders:
            each.close()
    return checksum, checkpoint, seen


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(Path(tmp))
        for name, ds in corpus.items():
            print(f"{name}: {len(ds)} documents, {ds.num_tokens} tokens")
        whole, _, seen = train(corpus, None)
        _, saved, _ = train(corpus, None, crash_at=CRASH_AT)
        assert saved is not None and saved["loader"]["step"] == 10
        resumed, _, again = train(corpus, saved)
        on_two, _, _ = train(corpus, saved, processes=2)
        print(f"uninterrupted {whole:#010x}, resumed {resumed:#010x}, on 2 hosts {on_two:#010x}")
        assert whole == resumed == on_two and seen == again
        total = sum(seen)
        shares = {n: f"{s / total:.1%}" for n, s in zip(corpus, seen, strict=True)}
        print("tokens seen by source:", shares)
        for ds in corpus.values():
            ds.close()


if __name__ == "__main__":
    main()
