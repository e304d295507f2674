"""Per-record maps, generators that resume, and worker workers (``workers=``): the same
stream of batches for any number of workers or threads, exact resume, batches handed over
from shared memory that stay intact while held, and a process model that does not leak or
hang (a failing map, a killed worker, a stuck one, the parent killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader, Dataset
from chute.errors import LoaderTimeoutError, LoaderWorkerError
from tests.loader import maps
from tests.objects.remote import to_s3

ROWS = np.arange(400 * 16, dtype=np.int32).reshape(400, 16)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workers") / "d"
    chute.write_dataset(path, ROWS, shard_records=150).close()
    return path


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(a, b))


def _run(path: Path, steps: int, *, start: int = 0, **options: Any) -> list[Any]:
    options = {"batch_size": 24, "seed": 5, **options}
    with Dataset(path) as ds, DataLoader({"x": ds}, **options) as dl:
        dl.seek(start)
        return [next(dl) for _ in range(steps)]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_the_stream_is_the_same_for_any_workers_and_resumes_exactly(
    dataset: Path, workers: int
) -> None:
    reference = _run(dataset, 12, map=maps.crop_flip, num_threads=3)
    assert not all(_same(reference[0], b) for b in reference[1:])  # the draws differ by step
    options = {"map": maps.crop_flip, "workers": workers}
    assert all(_same(a, b) for a, b in zip(reference, _run(dataset, 12, **options), strict=True))
    for stop in (1, 5, 11):  # stop, save, resume in a new loader: the uninterrupted stream
        with Dataset(dataset) as ds, DataLoader({"x": ds}, batch_size=24, seed=5, **options) as dl:
            for _ in range(stop):
                next(dl)
            state = dl.state_dict()
        with Dataset(dataset) as ds, DataLoader({"x": ds}, batch_size=24, seed=5, **options) as dl:
            dl.load_state_dict(state)
            assert _same(next(dl), reference[stop])


def test_draws_differ_across_cycles_and_seeds(dataset: Path) -> None:
    steps_a_cycle = len(ROWS) // 8
    cycle = _run(dataset, 2, start=0, map=maps.fixed_crop, sampler="sequential", batch_size=8)
    with Dataset(dataset) as ds:
        again = DataLoader({"x": ds}, batch_size=8, sampler="sequential", seed=5,
                           map=maps.fixed_crop, start_step=steps_a_cycle)  # fmt: skip
        with again:
            later = next(again)
        other = DataLoader({"x": ds}, batch_size=8, sampler="sequential", seed=6,
                           map=maps.fixed_crop)  # fmt: skip
        with other:
            reseeded = next(other)
    assert cycle[0]["x"].shape == (8, 4)  # a fixed shape stacks
    assert not np.array_equal(cycle[0]["x"], later["x"])  # same records, another cycle
    assert not np.array_equal(cycle[0]["x"], reseeded["x"])


def test_a_transform_that_asks_gets_its_own_generator(dataset: Path) -> None:
    threads = _run(dataset, 4, transform=maps.noise, map=maps.identity)
    workers = _run(dataset, 4, transform=maps.noise, map=maps.identity, workers=2)
    assert all(_same(a, b) for a, b in zip(threads, workers, strict=True))
    assert not np.array_equal(threads[0]["noise"], threads[1]["noise"])
    assert np.array_equal(threads[0]["x"], ROWS[threads[0]["x"][:, 0] // 16])


def test_held_batches_stay_intact(dataset: Path) -> None:
    held = _run(dataset, 40, map=maps.identity, workers=2, prefetch=2)
    again = _run(dataset, 40)
    assert all(_same(a, b) for a, b in zip(held, again, strict=True))
    assert held[0]["x"].flags.writeable  # a batch is the consumer's to change


def test_an_error_in_a_map_is_raised_by_next_with_its_type(dataset: Path) -> None:
    with Dataset(dataset) as ds:
        dl = DataLoader({"x": ds}, batch_size=10, sampler="sequential", seed=0,
                        map=maps.fail_on_seven, workers=2)  # fmt: skip
        with dl, pytest.raises(KeyError, match="record seven") as caught:
            next(dl)
        assert any("loader worker" in note for note in caught.value.__notes__)
        assert dl.step == 0


def test_a_killed_worker_is_an_error_naming_it_and_is_replaced(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "die"
    flag.touch()
    monkeypatch.setenv("CHUTE_TEST_DIE", str(flag))
    with Dataset(dataset) as ds:
        dl = DataLoader({"x": ds}, batch_size=10, sampler="sequential", seed=0,
                        map=maps.die_on_seven, workers=2)  # fmt: skip
        with dl:
            with pytest.raises(LoaderWorkerError, match=r"worker 0 .*SIGKILL.*step 0"):
                next(dl)
            flag.unlink()
            assert dl.step == 0 and np.array_equal(next(dl)["x"], ROWS[:10])


def test_a_stuck_worker_times_out_and_close_does_not_wait(dataset: Path) -> None:
    with Dataset(dataset) as ds:
        dl = DataLoader({"x": ds}, batch_size=10, sampler="sequential", seed=0,
                        map=maps.sleep_on_seven, workers=1, timeout=3)  # fmt: skip
        with pytest.raises(LoaderTimeoutError):
            next(dl)
        began = time.monotonic()
        dl.close()
        assert time.monotonic() - began < 10


_RETRY = """
import sys
import numpy as np
import chute
sys.path.insert(0, {root!r})
from tests.loader import maps
if __name__ == "__main__":
    rows = np.arange(40 * 16, dtype=np.int32).reshape(40, 16)
    with chute.DataLoader({{"x": rows}}, batch_size=10, sampler="sequential", seed=0,
                          map=maps.sleep_once_on_seven, workers=2, timeout=2) as dl:
        try:
            next(dl)
        except chute.errors.LoaderTimeoutError as e:
            print("timed out:", e, flush=True)
        print("step", dl.step, flush=True)
        for _ in range(3):
            print("first", int(next(dl)["x"][0, 0]), flush=True)
"""


def test_a_step_past_its_timeout_is_retried_on_a_new_worker(tmp_path: Path) -> None:
    """The killed worker is not handed the retried step (it used to be: LoaderWorkerError)."""
    script = tmp_path / "retry.py"
    script.write_text(_RETRY.format(root=str(Path(__file__).resolve().parents[2])))
    env = {**os.environ, "CHUTE_TEST_HANG_ONCE": str(tmp_path / "hung")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "worker process was killed" in lines[0] and "thread" not in lines[0]
    assert lines[1:] == ["step 0", "first 0", "first 160", "first 320"]


def test_a_map_that_does_not_pickle_is_named(dataset: Path) -> None:
    with Dataset(dataset) as ds:
        dl = DataLoader({"x": ds}, batch_size=10, map=lambda r: r, workers=1, seed=0)
        with dl, pytest.raises(TypeError, match="must pickle"):
            next(dl)


_ORPHAN = """
import os, sys, time
import numpy as np, chute
sys.path.insert(0, {root!r})
from tests.loader import maps
from tests.objects.remote import to_s3
if __name__ == "__main__":
    ds = chute.Dataset({path!r})
    dl = chute.DataLoader({{"x": ds}}, batch_size=8, seed=0, map=maps.identity, workers=2)
    next(dl)
    pids = [w.process.pid for w in dl._pool._workers if w is not None]
    print(*pids, flush=True)
    time.sleep(60)
"""


def test_killing_the_trainer_leaves_no_worker_nor_shared_memory(
    dataset: Path, tmp_path: Path
) -> None:
    shm = set(os.listdir("/dev/shm"))
    script = tmp_path / "trainer.py"
    root = str(Path(__file__).resolve().parents[2])
    script.write_text(_ORPHAN.format(root=root, path=str(dataset)))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    pids = [int(p) for p in child.stdout.readline().split()]
    assert len(pids) == 2
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)
    assert set(os.listdir("/dev/shm")) <= shm


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
        return f.read().split(") ")[1][0] != "Z"


@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="AddressSanitizer holds freed memory in quarantine: RSS grows by design there",
)
def test_memory_and_descriptors_stay_flat_over_many_steps(dataset: Path) -> None:
    with Dataset(dataset) as ds, DataLoader({"x": ds}, batch_size=4, seed=0, workers=2) as dl:
        for _ in range(2_000):
            next(dl)
        rss, fds = _rss(), len(os.listdir("/proc/self/fd"))
        for _ in range(50_000):
            next(dl)
        assert _rss() - rss < 16 << 20
        assert len(os.listdir("/proc/self/fd")) <= fds + 2


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_two_loaders_in_one_process(dataset: Path) -> None:
    with Dataset(dataset) as ds:
        a = DataLoader({"x": ds}, batch_size=24, seed=5, map=maps.crop_flip, workers=2)
        b = DataLoader({"x": ds}, batch_size=8, seed=1, sampler="sequential", workers=1)
        with a, b:
            got_a = [next(a) for _ in range(6)]
            got_b = [next(b)["x"] for _ in range(6)]
    want = _run(dataset, 6, map=maps.crop_flip)
    assert all(_same(x, y) for x, y in zip(got_a, want, strict=True))
    assert all(np.array_equal(x, ROWS[8 * k : 8 * k + 8]) for k, x in enumerate(got_b))


_STUCK = """
import sys
import chute
sys.path.insert(0, {root!r})
from tests.loader import maps
from tests.objects.remote import to_s3
if __name__ == "__main__":
    ds = chute.Dataset({path!r})
    dl = chute.DataLoader({{"x": ds}}, batch_size=10, sampler="sequential", seed=0,
                          map=maps.sleep_on_seven, workers=1, timeout=1)
    try:
        next(dl)
    except chute.errors.LoaderTimeoutError:
        print("timed out", flush=True)
"""


def test_the_interpreter_exits_with_a_stuck_worker_left_open(dataset: Path, tmp_path: Path) -> None:
    script = tmp_path / "stuck.py"
    root = str(Path(__file__).resolve().parents[2])
    script.write_text(_STUCK.format(root=root, path=str(dataset)))
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and "timed out" in done.stdout, done.stderr[-2000:]
    assert time.monotonic() - began < 30  # the worker killed, not waited on for its 60 s


def test_batches_without_a_map_are_gathered_straight_into_shared_memory(dataset: Path) -> None:
    pairs = zip(_run(dataset, 9, workers=2), _run(dataset, 9), strict=True)
    assert all(_same(a, b) for a, b in pairs)
    with Dataset(dataset) as ds:  # a finite pass with its padding mask, through the workers
        threads = list(chute.iterate({"x": ds}, 64, last="pad"))
        workers = list(chute.iterate({"x": ds}, 64, last="pad", workers=2))
    assert len(workers) == len(threads) == 7
    assert all(_same(a, b) for a, b in zip(workers, threads, strict=True))
    assert workers[-1]["mask"].sum() == len(ROWS) - 6 * 64


_TRAINER = """
import sys
import numpy as np, chute
sys.path.insert(0, {root!r})
from tests.loader import maps
from tests.objects.remote import to_s3
if __name__ == "__main__":
    ds = chute.Dataset({path!r})
    with chute.DataLoader({{"x": ds}}, batch_size=24, seed=5, map=maps.crop_flip, workers=2) as dl:
        total = sum(float(np.concatenate(next(dl)["x"]).sum()) for _ in range(30))
    print(total, flush=True)
"""


def test_two_trainers_on_one_host(dataset: Path, tmp_path: Path) -> None:
    script = tmp_path / "trainer.py"
    root = str(Path(__file__).resolve().parents[2])
    script.write_text(_TRAINER.format(root=root, path=str(dataset)))
    runs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    outs = [run.communicate(timeout=120)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs)
    want = sum(float(np.concatenate(b["x"]).sum()) for b in _run(dataset, 30, map=maps.crop_flip))
    assert [float(o) for o in outs] == [want, want]


def test_a_map_that_returns_no_record_is_named() -> None:
    streams = {"x": np.arange(10)}
    dl = DataLoader(streams, batch_size=4, seed=0, map=lambda r: [r["x"]])
    with dl, pytest.raises(TypeError, match="must return a dict"):
        next(dl)
    odd = DataLoader(streams, batch_size=4, seed=0, sampler="sequential",
                     map=lambda r: {"a": 1} if r["x"] else {"b": 1})  # fmt: skip
    with odd, pytest.raises(TypeError, match="same keys"):
        next(odd)


def test_workers_read_a_dataset_in_object_storage(dataset: Path, s3_server: str) -> None:
    url, options = to_s3(dataset, s3_server)
    ds = Dataset(url, **options)
    with ds, DataLoader({"x": ds}, batch_size=24, seed=5, map=maps.crop_flip, workers=2) as dl:
        got = [next(dl) for _ in range(5)]
    want = _run(dataset, 5, map=maps.crop_flip)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True))
