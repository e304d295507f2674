"""Language-model data: token windows, packed sequences and a 3-source mixture, against
nanoGPT's memory-mapped ``get_batch`` and LitData's ``TokensLoader``.

Corpus: the standard library's ``.py`` files (site-packages left out) as byte-level
``uint16`` tokens, one document per file. ``seq_len`` 1024 (windows of 1025 tokens: inputs
and next-token targets), batch 32. Contenders:

* chute windows: ``DataLoader(TokenWindows(ds, 1024), batch_size=32)`` (its default threads),
  each epoch a permutation of the windows;
* nanoGPT: ``np.memmap`` of the tokens and its ``get_batch`` (32 random offsets, ``x`` and
  ``y`` stacked as int64 tensors), run on a prefetch thread 4 batches ahead, to be fair;
* LitData: ``optimize(..., item_loader=TokensLoader())`` then ``StreamingDataset(...,
  TokensLoader(block_size=1025), shuffle=True)`` in a ``StreamingDataLoader`` with 2 workers;
* chute packed: ``DataLoader(PackedTokens(ds, 1024), batch_size=32)``, counted in real
  (non-pad) tokens;
* mixtures of 3 sources (the top-level modules, the packages, the test suite; weights 0.5,
  0.3, 0.2; each source's tokens shifted by 256 * its number, so a window tells its source):
  ``chute.mix`` of windows against LitData's ``CombinedStreamingDataset(weights=...)``;
  reported: tokens/s, and the largest error of any source's share of the tokens so far,
  taken every 100 steps.

Every run is a process of its own; contenders take turns, round by round (medians).

    python bench/tokens.py [--rounds 3] [--plot]   # writes bench/results/tokens.md/.png
    python bench/tokens.py --tiny                  # a smoke run that writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _child import report as report_result
from _child import spawn

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "tokens"
RESULTS = ROOT / "results"
SEQ, BATCH = 1024, 32
SOURCES = ("modules", "packages", "tests")
WEIGHTS = (0.5, 0.3, 0.2)
CONTENDERS = (
    "chute windows",
    "nanoGPT memmap + prefetch",
    "LitData TokensLoader",
    "chute packed",
    "chute mix, 3 sources",
    "LitData combined, 3 sources",
    "chute windows, seq_len 4096",
    "chute mix, 3 sources, seq_len 4096",
)
LONG = 4096  # the context rows: a longer sequence, where a batch's fixed costs weigh less


# -- the corpus -----------------------------------------------------------------------------


def corpus() -> dict[str, list[Path]]:
    """The standard library's .py files, by source of the mixture."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts: dict[str, list[Path]] = {name: [] for name in SOURCES}
    for path in sorted(lib.rglob("*.py")):
        rel = path.relative_to(lib).parts
        if "site-packages" in rel or not path.stat().st_size:
            continue
        source = "tests" if "test" in rel or "tests" in rel else (
            "modules" if len(rel) == 1 else "packages")  # fmt: skip
        parts[source].append(path)
    return parts


def tokens_of(path: Path, shift: int = 0) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), np.uint8).astype(np.uint16) + np.uint16(shift)


def prepare(root: Path, tiny: bool) -> dict[str, Any]:
    """Every contender's copy of the corpus, written once."""
    import chute

    parts = corpus()
    if tiny:
        parts = {k: v[:40] for k, v in parts.items()}
    files = [p for name in SOURCES for p in parts[name]]
    chute.write_tokens(root / "all.chute", (tokens_of(p) for p in files), progress=False).close()
    with open(root / "train.bin", "wb") as out:  # nanoGPT's prepare.py: one flat uint16 file
        for p in files:
            tokens_of(p).tofile(out)
    for k, name in enumerate(SOURCES):
        chute.write_tokens(root / f"{name}.chute", (tokens_of(p, 256 * k) for p in parts[name]),
                           progress=False).close()  # fmt: skip
    _litdata_write(root / "all.lit", files, 0)
    for k, name in enumerate(SOURCES):
        _litdata_write(root / f"{name}.lit", parts[name], 256 * k)
    sizes = {n: int(sum(p.stat().st_size for p in parts[n])) for n in SOURCES}
    return {"tokens": sum(sizes.values()), "documents": len(files), "sources": sizes}


def _litdata_tokens(path: str, shift: int) -> Any:
    import torch

    yield torch.from_numpy(tokens_of(Path(path), shift).astype(np.int32))


def _litdata_write(out: Path, files: list[Path], shift: int) -> None:
    import functools

    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    optimize(fn=functools.partial(_litdata_tokens, shift=shift), inputs=[str(p) for p in files],
             output_dir=str(out), chunk_size=(SEQ + 1) * 1024, item_loader=TokensLoader(),
             num_workers=1, mode="overwrite")  # fmt: skip


# -- one run, in a child process ------------------------------------------------------------


def _nanogpt(root: Path) -> Any:
    import torch

    data = np.memmap(root / "train.bin", dtype=np.uint16, mode="r")
    gen = torch.Generator().manual_seed(0)

    def get_batch() -> Any:  # nanoGPT's train.py
        ix = torch.randint(len(data) - SEQ, (BATCH,), generator=gen)
        x = torch.stack([torch.from_numpy((data[i : i + SEQ]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + SEQ]).astype(np.int64))
                         for i in ix])  # fmt: skip
        return x, y

    ahead: queue.Queue[Any] = queue.Queue(maxsize=4)

    def fill() -> None:
        while True:
            ahead.put(get_batch())

    threading.Thread(target=fill, daemon=True).start()
    while True:
        x, _ = ahead.get()
        yield x.shape[0] * (x.shape[1] + 1), x[:, 0].numpy()


def _litdata(root: Path, names: list[str]) -> Any:
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    sets = [StreamingDataset(str(root / f"{n}.lit"), item_loader=TokensLoader(block_size=SEQ + 1),
                             shuffle=True, seed=0, drop_last=True) for n in names]  # fmt: skip
    data = sets[0] if len(sets) == 1 else CombinedStreamingDataset(
        sets, seed=0, weights=list(WEIGHTS), iterate_over_all=False)  # fmt: skip
    loader = StreamingDataLoader(data, batch_size=BATCH, num_workers=2, drop_last=True)
    while True:
        for batch in loader:
            yield batch.numel(), batch[:, 0].numpy()


def _chute(root: Path, kind: str, seq: int = SEQ) -> Any:
    import chute

    if kind == "mix":
        sources = {n: chute.TokenWindows(chute.TokenDataset(root / f"{n}.chute"), seq)
                   for n in SOURCES}  # fmt: skip
        stream: Any = chute.mix(sources, dict(zip(SOURCES, WEIGHTS, strict=True)))
    elif kind == "packed":
        stream = chute.PackedTokens(chute.TokenDataset(root / "all.chute"), seq)
    else:
        stream = chute.TokenWindows(chute.TokenDataset(root / "all.chute"), seq)
    with chute.DataLoader(stream, batch_size=BATCH, seed=0) as loader:
        for batch in loader:
            if kind == "packed":
                yield int(np.count_nonzero(batch["segment_ids"])), batch["tokens"][:, 0]
            else:
                yield batch["tokens"].size, batch["tokens"][:, 0]


def _bare(root: Path, batches: int) -> dict[str, float]:
    """Microseconds a batch of windows and of packed sequences takes to read on the calling
    thread, no loader (each stream's own order; best of 5 passes): what packing adds to
    the read itself, to set beside the loader's ratio."""
    import chute

    ds = chute.TokenDataset(root / "all.chute")
    windows, packed = chute.TokenWindows(ds, SEQ), chute.PackedTokens(ds, SEQ)
    order = np.random.default_rng(0).permutation(len(windows)).astype(np.uint64)
    rows = {"windows": [order[i * BATCH % (len(order) - BATCH):][:BATCH] for i in range(batches)],
            "packed": np.split(packed.order(0, 0, batches * BATCH), batches)}  # fmt: skip
    got = {}
    for name, stream in (("windows", windows), ("packed", packed)):
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for r in rows[name]:
                stream.__getitems__(r)
            best = min(best, (time.perf_counter() - start) / batches)
        got[f"{name}_us"] = best * 1e6
    return got


def _child(spec: dict[str, Any]) -> None:
    root, kind, batches = Path(spec["root"]), spec["kind"], spec["batches"]
    if kind == "bare reads":
        report_result(_bare(root, batches))
        return
    makers = {
        "chute windows": lambda: _chute(root, "windows"),
        "chute packed": lambda: _chute(root, "packed"),
        "chute mix, 3 sources": lambda: _chute(root, "mix"),
        "nanoGPT memmap + prefetch": lambda: _nanogpt(root),
        "LitData TokensLoader": lambda: _litdata(root, ["all"]),
        "LitData combined, 3 sources": lambda: _litdata(root, list(SOURCES)),
        "chute windows, seq_len 4096": lambda: _chute(root, "windows", LONG),
        "chute mix, 3 sources, seq_len 4096": lambda: _chute(root, "mix", LONG),
    }
    stream = makers[kind]()
    next(stream)  # start-up (workers, threads, first fetch) is not counted
    tokens, per_source = 0, np.zeros(len(SOURCES))
    worst = 0.0
    share = np.array(WEIGHTS)
    start = time.perf_counter()
    for step in range(1, batches + 1):
        n, firsts = next(stream)
        tokens += n
        per_source += np.bincount(np.asarray(firsts, np.int64) // 256, minlength=3)[:3]
        if step % 100 == 0:
            worst = max(worst, float(np.abs(per_source / per_source.sum() - share).max()))
    seconds = time.perf_counter() - start
    report_result({"tokens_s": tokens / seconds, "share_error": worst})
    os._exit(0)  # loader workers and prefetch threads are not waited for


# -- report ---------------------------------------------------------------------------------


def _nonpad(root: Path) -> float:
    import chute

    packed = chute.PackedTokens(chute.TokenDataset(root / "all.chute"), SEQ)
    real = 0
    for start in range(0, len(packed), 4096):
        rows = np.arange(start, min(start + 4096, len(packed)), dtype=np.uint64)
        real += int(np.count_nonzero(packed.__getitems__(rows)["segment_ids"]))
    return real / (len(packed) * SEQ)


def report(runs: dict[str, list[dict[str, float]]], facts: dict[str, Any], nonpad: float,
           bare: dict[str, float] | None,
           args: argparse.Namespace) -> tuple[str, dict[str, float]]:  # fmt: skip
    med = {c: statistics.median(r["tokens_s"] for r in rs) for c, rs in runs.items() if rs}
    err = {c: max(r["share_error"] for r in rs) for c, rs in runs.items() if rs}
    lines = [
        "# Language-model data: windows, packing, mixtures",
        "",
        f"The standard library's .py files as byte-level uint16 tokens: {facts['documents']} "
        f"documents, {facts['tokens'] / 1e6:.1f} M tokens (mixture sources: "
        + ", ".join(f"{n} {v / 1e6:.1f} M" for n, v in facts["sources"].items())
        + f"). seq_len {SEQ}, batch {BATCH}; {args.batches} batches after the first, each run "
        f"a process of its own, medians of {args.rounds} interleaved rounds; 2 cores.",
        "",
        "| contender | M tokens/s | largest share error (every 100 steps) |",
        "|---|---:|---:|",
    ]
    for c in CONTENDERS:
        if c in med:
            mixed = "3 sources" in c
            lines.append(f"| {c} | {med[c] / 1e6:.1f} | {f'{err[c]:.2%}' if mixed else ''} |")
        else:
            lines.append(f"| {c} | failed | |")
    checks = []

    def ratio(a: str, b: str) -> float | None:
        return med[a] / med[b] if a in med and b in med else None

    for label, a, b, goal in (
        ("windows vs nanoGPT with prefetch", "chute windows", "nanoGPT memmap + prefetch", 1.5),
        ("windows vs LitData TokensLoader", "chute windows", "LitData TokensLoader", 2.0),
        ("packed (real tokens) vs windows", "chute packed", "chute windows", 0.8),
        ("mixture vs one source", "chute mix, 3 sources", "chute windows", 0.9),
    ):
        value = ratio(a, b)
        if value is not None:
            checks.append((label, f"{value:.2f}x", f">= {goal}x", value >= goal))
    checks.append(("packed: real (non-pad) tokens", f"{nonpad:.2%}", ">= 99%", nonpad >= 0.99))
    longer = ratio("chute mix, 3 sources, seq_len 4096", "chute windows, seq_len 4096")
    if "chute mix, 3 sources" in err:
        e = err["chute mix, 3 sources"]
        checks.append(("mixture: largest share error", f"{e:.3%}", "<= 0.5%", e <= 0.005))
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    lines += [f"| {a} | {b} | {c} | {'yes' if d else 'no'} |" for a, b, c, d in checks]
    if longer is not None:
        lines += ["", f"Context, not a target: at seq_len {LONG} (batch {BATCH}) the mixture "
                  f"runs at {longer:.2f}x one source."]  # fmt: skip
    if bare is not None and "chute windows" in med and "chute packed" in med:
        per = {c: BATCH * SEQ / med[c] * 1e6 for c in ("chute windows", "chute packed")}
        lines += [
            "",
            f"Context for packing: read alone on one thread (no loader, best of 5 passes of "
            f"{args.batches} batches), a batch of windows takes {bare['windows_us']:.1f} us "
            f"and a packed batch {bare['packed_us']:.1f} us "
            f"({bare['windows_us'] / bare['packed_us']:.2f}x: with its int32 segment ids and "
            f"positions beside the uint16 tokens, it writes five times the bytes); through "
            f"the loader, {per['chute windows']:.1f} and {per['chute packed']:.1f} us a batch.",
        ]
    return "\n".join(lines) + "\n", med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 4000 batches: a chute run of 1000 lasted some 50 ms, shorter than the machine's noise
    p.add_argument("--batches", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--plot", action="store_true")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(json.loads(args.child))
        return
    if args.tiny:
        args.batches, args.rounds = 20, 1
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        root = Path(tmp)
        print("writing the corpus for every contender", file=sys.stderr)
        facts = prepare(root, args.tiny)
        runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
        for r in range(args.rounds):
            order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
            for c in order:
                print(f"round {r + 1}: {c}", file=sys.stderr)
                got = spawn(__file__, {"root": str(root), "kind": c, "batches": args.batches})
                if isinstance(got, str):
                    print(f"  {got}", file=sys.stderr)
                else:
                    runs[c].append(got)
        nonpad = _nonpad(root)
        bare = spawn(__file__, {"root": str(root), "kind": "bare reads", "batches": args.batches})
    text, med = report(runs, facts, nonpad, bare if isinstance(bare, dict) else None, args)
    print(text)
    if args.tiny:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tokens.md").write_text(text)
    if args.plot:
        from _charts import ratio_chart

        names = [c for c in CONTENDERS if c in med]
        ratio_chart(RESULTS / "tokens.png", "Language-model data: tokens/s", names,
                    {"tokens/s": [med[c] for c in names]})  # fmt: skip


if __name__ == "__main__":
    main()
