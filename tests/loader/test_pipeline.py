"""The loader's workers: a batch that takes too long raises (``timeout=``), and a transform
that never returns holds up neither ``close()`` nor the interpreter's exit."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader, EvalPass

from ..store.isolate import OK, WRONG_DATA, run_isolated

STUCK = """
import threading, numpy as np, chute
entered = threading.Event()
def stuck(batch):
    entered.set()
    threading.Event().wait()  # never returns
    return batch
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; a hang (past 60 s) fails the test."""
    return subprocess.run(
        [sys.executable, "-c", STUCK + code], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("kind", ["DataLoader", "EvalPass"])
def test_a_stuck_transform_with_a_timeout_raises_and_close_returns(kind: str) -> None:
    proc = _run(f"""
dl = chute.{kind}({{"x": np.arange(100)}}, batch_size=4, transform=stuck, num_threads=2,
                  timeout=0.3)
for attempt in range(2):  # the step stays put; trying again times out again
    try:
        next(dl)
    except chute.errors.LoaderTimeoutError as e:
        assert isinstance(e, TimeoutError) and isinstance(e, chute.ChuteError)
        print(dl.step, str(e).split(":")[0])
dl.close()
print("closed")
""")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == ["0 the batch of step 0 was not ready within timeout=0.3 s"] * 2 + ["closed"]


@pytest.mark.parametrize("close", [True, False])
def test_a_stuck_transform_without_a_timeout_lets_the_interpreter_exit(close: bool) -> None:
    proc = _run(f"""
dl = chute.DataLoader({{"x": np.arange(100)}}, batch_size=4, transform=stuck, num_threads=2)
threading.Thread(target=next, args=(dl,), daemon=True).start()  # waits for ever
entered.wait()
if {close}:
    dl.close()
    print("closed")
print("exiting")
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["closed", "exiting"] if close else ["exiting"]


def test_a_slow_batch_past_the_timeout_is_tried_again_and_the_stream_goes_on() -> None:
    release = threading.Event()
    attempts: list[int] = []

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        if batch["x"][0] == 8:
            attempts.append(8)
            if len(attempts) == 1:
                release.wait(30)  # the first attempt at step 2 hangs until released
        return batch

    streams = {"x": np.arange(100)}
    with DataLoader(streams, 4, "sequential", transform=transform, timeout=0.2) as dl:
        assert [next(dl)["x"][0] for _ in range(2)] == [0, 4]
        with pytest.raises(chute.errors.LoaderTimeoutError, match="step 2"):
            next(dl)
        assert dl.step == 2
        assert [next(dl)["x"][0] for _ in range(2)] == [8, 12]  # on another worker
        release.set()
    assert len(attempts) == 2
    with EvalPass(streams, 40, timeout=5) as p:  # a timeout that is never reached
        assert [len(b["x"]) for b in p] == [40, 40, 20]


def test_a_batch_that_raises_timeout_error_itself_is_not_a_loader_timeout() -> None:
    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        raise TimeoutError("the transform's own socket timed out")

    with DataLoader({"x": np.arange(10)}, 2, transform=transform, timeout=5) as dl:
        with pytest.raises(TimeoutError, match="own socket") as info:
            next(dl)
        assert not isinstance(info.value, chute.ChuteError)


def test_timeout_is_checked() -> None:
    streams = {"x": np.arange(10)}
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
            DataLoader(streams, 2, timeout=bad)
    for bad in (True, "1"):
        with pytest.raises(TypeError, match="timeout must be a number of seconds or None"):
            DataLoader(streams, 2, timeout=bad)  # type: ignore[arg-type]
    with DataLoader(streams, 2, timeout=np.float32(2)) as dl:
        assert dl.timeout == 2.0 and dl.epoch().timeout == 2.0
    assert chute.iterate(streams, 2, timeout=3).timeout == 3.0


def test_close_waits_for_batches_being_built_within_the_timeout() -> None:
    done: list[int] = []

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.05)
        done.append(int(batch["x"][0]))
        return batch

    before = set(threading.enumerate())
    dl = DataLoader({"x": np.arange(100)}, 4, "sequential", transform=transform, num_threads=2)
    next(dl)
    dl.close()  # the batches running finished: no worker outlives close() here
    assert set(threading.enumerate()) <= before
    assert 0 in done


def test_a_forked_child_gets_workers_of_its_own() -> None:
    dl = DataLoader({"x": np.arange(100)}, 4, "sequential", num_threads=2)
    assert next(dl)["x"].tolist() == [0, 1, 2, 3]  # the parent's workers run, batches queued

    def child() -> int:
        got = [next(dl)["x"].tolist() for _ in range(2)]
        dl.close()
        return OK if got == [[4, 5, 6, 7], [8, 9, 10, 11]] else WRONG_DATA

    assert run_isolated(child, timeout=30) == OK
    assert next(dl)["x"].tolist() == [4, 5, 6, 7]
    dl.close()


def test_whether_a_stream_gathers_into_a_buffer_is_decided_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime Protocol check is slow (about half a worker's Python per batch on 3.11):
    the loader makes it once per stream, not once per batch."""
    from chute._util.buffers import BatchBuffers
    from chute.loader import _pipeline
    from chute.loader._streams import GathersInto

    checked: list[object] = []

    class Counting:
        def __instancecheck__(self, stream: object) -> bool:
            checked.append(stream)
            return isinstance(stream, GathersInto)

    monkeypatch.setattr(_pipeline, "GathersInto", Counting())
    data = {"x": np.arange(300, dtype=np.float32).reshape(100, 3), "y": np.arange(100)}
    with DataLoader(data, batch_size=8, sampler="sequential", num_threads=2) as dl:
        ring = BatchBuffers(keep=32)
        dl.use_buffers(ring)
        for step in range(20):
            batch = next(dl)
            assert ring.owns(batch["x"]) and ring.owns(batch["y"])  # gathered into the ring
            np.testing.assert_array_equal(batch["y"], np.arange(step * 8, step * 8 + 8) % 100)
    assert len(checked) == 2  # once per stream, when the loader was made


def test_a_worker_lays_out_its_slot_without_numpy_calls_per_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chute.loader import _processes
    from chute.loader._streams import as_streams

    arrays = {"x": np.arange(60, dtype=np.float32).reshape(20, 3), "y": np.arange(20)}
    streams = as_streams(arrays)  # what a loader hands its workers
    direct = _processes._direct(streams)
    assert direct is not None and _processes._direct({**streams, "s": ["a"] * 20}) is None
    slots = _processes._Slots()

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("np.prod runs per batch")

    monkeypatch.setattr(np, "prod", refused)
    indices = np.array([3, 1, 4], dtype=np.uint64)
    status, slot, size, nbytes, body = _processes._gathered_into(slots, direct, indices, {})
    assert status == "ok" and size >= nbytes
    root = np.frombuffer(slots.maps[slot][1], np.uint8, count=nbytes)
    batch = _processes._unpack(pickle.loads(body), root)
    np.testing.assert_array_equal(batch["x"], arrays["x"][[3, 1, 4]])
    np.testing.assert_array_equal(batch["y"], [3, 1, 4])
    del batch, root


def test_cheap_steps_go_to_a_worker_in_runs_with_the_same_stream_errors_and_seeks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps that build in microseconds are handed over several at a time (waking a worker
    costs as much as the step); what the consumer sees is the same as one at a time: the
    batches, an error at its own step (those before it delivered), a seek into a run."""
    from chute.loader import _pipeline, _workers

    monkeypatch.setattr(
        _pipeline, "CHEAP_STEP", 60.0
    )  # every step counts as cheap, however loaded the machine
    tasks: list[int] = []
    submit = _workers.Workers.submit

    def counting(self: Any, fn: Any, *args: Any) -> Any:
        tasks.append(args[-1] if len(args) == 3 else 1)  # _build_run(build, first, count)
        return submit(self, fn, *args)

    monkeypatch.setattr(_workers.Workers, "submit", counting)
    data = {"y": np.arange(1000)}
    failing = {13}

    def flaky(batch: dict[str, Any]) -> dict[str, Any]:
        if int(batch["y"][0]) // 10 in failing:
            raise ZeroDivisionError("bad batch")
        return batch

    with DataLoader(data, 10, sampler="sequential", num_threads=1, prefetch=1) as one_by_one:
        expected = [int(next(one_by_one)["y"][0]) for _ in range(40)]
    assert set(tasks) == {1}
    tasks.clear()
    with DataLoader(data, 10, sampler="sequential", num_threads=1, prefetch=16,
                    transform=flaky) as dl:  # fmt: skip
        got = [int(next(dl)["y"][0]) for _ in range(13)]
        with pytest.raises(ZeroDivisionError, match="bad batch"):
            next(dl)
        assert dl.step == 13 and got == expected[:13]
        failing.clear()
        got += [int(next(dl)["y"][0]) for _ in range(27)]
        assert got == expected
        assert max(tasks) > 1 and len(tasks) < 40  # runs, after the first steps were timed
        dl.seek(42)
        next(dl)  # a run 43.. is queued now
        dl.sampler.seek(45)  # into it, behind the loader's back
        assert int(next(dl)["y"][0]) == 450
        dl.seek(3)
        assert [int(next(dl)["y"][0]) for _ in range(3)] == [30, 40, 50]


def test_two_threads_taking_batches_get_each_step_once() -> None:
    """next() from two threads at once: served one after another, every step delivered to
    exactly one of them, none twice, none lost."""
    got: list[int] = []
    lock = threading.Lock()
    with DataLoader({"y": np.arange(10_000)}, batch_size=8, sampler="sequential",
                    num_threads=2) as loader:  # fmt: skip

        def take() -> None:
            for _ in range(200):
                first = int(next(loader)["y"][0])
                with lock:
                    got.append(first)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert loader.step == 400
    assert sorted(got) == list(range(0, 3200, 8))


def test_closing_while_another_thread_iterates_ends_it_cleanly() -> None:
    ended: list[BaseException] = []

    def slow(batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.01)
        return batch

    loader = DataLoader({"y": np.arange(1000)}, batch_size=8, num_threads=2, transform=slow)

    def iterate() -> None:
        try:
            for _ in loader:
                pass
        except BaseException as e:
            ended.append(e)

    thread = threading.Thread(target=iterate)
    thread.start()
    time.sleep(0.2)
    loader.close()
    thread.join(10)
    assert not thread.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], RuntimeError)
    assert "closed" in str(ended[0])
