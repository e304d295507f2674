"""Finite evaluation passes: every record exactly once, in order, the last batch selectable."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader, iterate

N = 103  # not a multiple of any batch size used here


def _streams() -> dict[str, Any]:
    return {"y": np.arange(N), "x": np.arange(N * 3, dtype=np.float32).reshape(N, 3)}


@pytest.mark.parametrize("batch", [1, 10, 64, 103, 200])
@pytest.mark.parametrize(("threads", "prefetch"), [(1, 1), (3, 5), (1, 16)])
def test_partial_pass_visits_every_record_once_in_order(
    batch: int, threads: int, prefetch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every step counts as cheap: with prefetch=16 a worker takes runs of 8, cut at the end
    monkeypatch.setattr("chute.loader._pipeline.CHEAP_STEP", 60.0)
    with iterate(_streams(), batch, num_threads=threads, prefetch=prefetch) as p:
        assert len(p) == -(-N // batch)
        batches = list(p)
        assert list(p) == []  # finished: no wrap-around
    assert len(batches) == -(-N // batch)
    np.testing.assert_array_equal(np.concatenate([b["y"] for b in batches]), np.arange(N))
    assert all(len(b["y"]) == batch for b in batches[:-1])
    assert len(batches[-1]["y"]) == N - batch * (len(batches) - 1)
    for b in batches:
        np.testing.assert_array_equal(b["x"][:, 0], b["y"] * 3)


def test_iterate_is_the_eval_pass_constructor_under_its_own_name() -> None:
    params = inspect.signature(iterate).parameters
    assert params == inspect.signature(chute.EvalPass).parameters
    assert list(params)[:2] == ["streams", "batch_size"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in list(params)[2:])
    p = iterate(_streams(), 10, indices=[3, 1], last="pad", prefetch=2, shard=None)
    assert type(p) is chute.EvalPass and (p.batch_size, p.last, p.prefetch) == (10, "pad", 2)
    with pytest.raises(TypeError, match="'lst'"):
        iterate(_streams(), 2, lst="pad")  # type: ignore[call-arg]


def test_padded_pass_has_full_batches_and_a_mask() -> None:
    batches = list(iterate(_streams(), 25, last="pad", num_threads=2))
    assert len(batches) == 5
    assert all(b["y"].shape == (25,) and b["mask"].dtype == np.bool_ for b in batches)
    real = np.concatenate([b["y"][b["mask"]] for b in batches])
    np.testing.assert_array_equal(real, np.arange(N))
    assert batches[-1]["mask"].sum() == 3 and batches[0]["mask"].all()
    assert (batches[-1]["y"][~batches[-1]["mask"]] == N - 1).all()  # padding repeats a record
    with pytest.raises(ValueError, match="'mask' entry"):
        iterate({"mask": np.arange(5)}, 2, last="pad")
    with pytest.raises(ValueError, match="last must be one of"):
        iterate(_streams(), 2, last="drop")  # type: ignore[arg-type]


@pytest.mark.parametrize("last", ["partial", "pad"])
def test_a_pass_over_a_subset_follows_the_given_order(last: str) -> None:
    members = np.array([90, 3, 3, 57, 102, 0, 41])  # any order, repeats allowed
    batches = list(iterate(_streams(), 3, indices=members, last=last))  # type: ignore[arg-type]
    ys = [b["y"][b["mask"]] if last == "pad" else b["y"] for b in batches]
    np.testing.assert_array_equal(np.concatenate(ys), members)


@pytest.mark.parametrize("last", ["partial", "pad"])
def test_sharded_passes_together_cover_the_records_once(last: str) -> None:
    count, batch = 4, 16
    seen: list[np.ndarray] = []
    lengths = []
    for i in range(count):
        p = iterate(_streams(), batch, last=last, shard=(i, count))  # type: ignore[arg-type]
        with p:
            got = list(p)
        lengths.append(len(got))
        for b in got:
            assert len(b["y"]) <= batch // count
            seen.append(b["y"][b["mask"]] if last == "pad" else b["y"])
            if last == "pad":
                assert len(b["y"]) == batch // count
    assert len(set(lengths)) == 1  # every process runs the same number of steps
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(N))


def test_the_loader_epoch_reuses_its_configuration() -> None:
    members = chute.split(N, [0.75, 0.25], seed=1)[1]

    def collate(batch: dict[str, Any]) -> dict[str, Any]:
        return {"twice": batch["y"] * 2}

    with DataLoader(_streams(), 10, indices=members, num_threads=2, transform=collate) as dl:
        next(dl)
        with dl.epoch() as val:
            assert val.num_threads == 2 and val.batch_size == 10
            out = np.concatenate([b["twice"] for b in val])
        np.testing.assert_array_equal(out, members * 2)
        assert dl.step == 1  # the pass does not move the endless loader
        with dl.epoch(batch_size=7, last="pad") as val:
            assert all(b["twice"].shape == (7,) for b in val)


def test_errors_surface_and_a_pass_restarts_with_seek() -> None:
    calls = {"n": 0}

    def flaky(batch: dict[str, Any]) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ZeroDivisionError("once")
        return batch

    p = iterate(_streams(), 50, transform=flaky, num_threads=1, prefetch=1)
    first = next(p)
    with pytest.raises(ZeroDivisionError):
        next(p)
    assert p.step == 1
    rest = list(p)
    np.testing.assert_array_equal(
        np.concatenate([first["y"], *[b["y"] for b in rest]]), np.arange(N)
    )
    p.seek(0)
    assert len(list(p)) == 3
    with pytest.raises(ValueError, match="past the end"):
        p.seek(4)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(p)


def test_a_finished_pass_holds_no_threads() -> None:
    before = {t.ident for t in threading.enumerate()}
    p = iterate(_streams(), 10, num_threads=3)
    list(p)
    new = [t for t in threading.enumerate() if t.ident not in before]
    assert not [t for t in new if t.name.startswith("chute-loader")]


def test_train_val_example_runs() -> None:
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "train_val.py"
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "100 steps, resumed at 60: identical" in proc.stdout


@pytest.mark.parametrize("last", ["partial", "pad"])
def test_a_pass_resumes_exactly_from_its_state(last: str) -> None:
    import json

    members = chute.split(N, [0.5, 0.5], seed=4)[0]
    whole = list(iterate(_streams(), 8, indices=members, last=last))  # type: ignore[arg-type]
    got: list[dict[str, Any]] = []
    state = None
    for stop, threads in [(2, 1), (0, 3), (3, 2), (100, 1)]:
        with iterate(_streams(), 8, indices=members, last=last, num_threads=threads) as p:  # type: ignore[arg-type]
            if state is not None:
                p.load_state_dict(state)
            for _ in range(stop):
                batch = next(p, None)
                if batch is None:
                    break
                got.append(batch)
            state = json.loads(json.dumps(p.state_dict()))
    assert len(got) == len(whole)
    for a, b in zip(got, whole, strict=True):
        np.testing.assert_array_equal(a["y"], b["y"])
    other = iterate(_streams(), 8, last=last)  # type: ignore[arg-type]
    with other, pytest.raises(ValueError, match="indices: saved"):
        other.load_state_dict(state)
    with DataLoader(_streams(), 8) as dl:
        loader_state = dl.state_dict()
    with iterate(_streams(), 8) as p, pytest.raises(ValueError, match="not a chute EvalPass"):
        p.load_state_dict(loader_state)
