"""The device stage over the step loader, on CPU: order, buffer lifetime, errors, resume.

With ``device="cpu"`` the stage runs the same code as on a GPU host (ring, copies started
ahead, tickets, hand-over), only with ordinary memory; a fake mover whose copies finish
only when asked stands in for an asynchronous copy engine.
"""

from __future__ import annotations

import ctypes
import gc
import json
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import DataLoader
from chute._util.buffers import plain
from chute.frameworks import DeviceLoader, to_device
from chute.frameworks._device import DeviceView
from tests.batches_util import assert_same_batches
from tests.objects.remote import Serve

from .store.isolate import OK, WRONG_DATA, run_isolated

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

N = 240
DATA = {
    "x": np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3),
    "y": np.arange(N, dtype=np.int32),
}
FRAMEWORKS = [("torch", "cpu"), ("jax", None)]


def _loader(threads: int = 2, sampler: str = "iid", **kw: Any) -> DataLoader:
    return DataLoader(
        kw.pop("streams", DATA),
        batch_size=16,
        sampler=sampler,  # type: ignore[arg-type]
        seed=11,
        num_threads=threads,
        **kw,
    )


def _reference(n: int, start: int = 0, **kw: Any) -> list[dict[str, Any]]:
    with _loader(1, **kw) as dl:
        dl.seek(start)
        return [next(dl) for _ in range(n)]


@pytest.mark.parametrize(("framework", "device"), FRAMEWORKS)
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("depth", [1, 3])
def test_same_batches_in_step_order_for_any_threads_and_depth(
    framework: str, device: Any, threads: int, depth: int
) -> None:
    want = _reference(25)
    with to_device(_loader(threads), device, depth=depth, framework=framework) as dev:  # type: ignore[arg-type]
        assert isinstance(dev, DeviceLoader)
        got = []
        for step in range(25):
            assert dev.step == step
            got.append(next(dev))
    assert_same_batches(got, want)
    kind = torch.Tensor if framework == "torch" else jax.Array
    assert all(isinstance(v, kind) for b in got for v in b.values())


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("shard_records", [None, 70])
def test_store_datasets_gather_straight_into_the_ring(
    tmp_path: Path, shard_records: int | None, where: str, request: pytest.FixtureRequest
) -> None:
    serve = Serve(None if where == "local" else request.getfixturevalue("s3_server"))
    images = np.random.default_rng(0).integers(0, 255, (N, 3, 8, 8), dtype=np.uint8)
    written = chute.write_dataset(
        tmp_path / "i.zr", images, progress=False, shard_records=shard_records
    )
    streams = {
        "img": serve(written),
        "label": serve(chute.write_dataset(tmp_path / "l.zr", np.arange(N) % 7, codec="raw")),
    }
    want = _reference(12, streams=streams)
    loader = _loader(3, streams=streams)
    gathered: list[bool] = []
    inner = streams["img"].gather_into

    def spy(indices: Any, out: np.ndarray) -> np.ndarray:
        gathered.append(loader._buffers is not None and loader._buffers.owns(out))
        return inner(indices, out)

    streams["img"].gather_into = spy  # type: ignore[method-assign]
    with to_device(loader, "cpu", depth=2) as dev:
        assert_same_batches([next(dev) for _ in range(12)], want)
    assert gathered and all(gathered)
    with pytest.raises(ValueError, match="batch is"):
        streams["img"].gather_into(np.arange(4), np.empty((3, 3, 8, 8), np.uint8))


def test_device_batches_are_fresh_memory_the_consumer_keeps() -> None:
    with to_device(_loader(2), "cpu", depth=2) as dev:
        first = next(dev)
        snapshot = {k: v.clone() for k, v in first.items()}
        for _ in range(40):  # enough batches to recycle every host buffer many times
            next(dev)
        ring = dev.loader._buffers
        assert ring is not None and not ring.owns(first["x"].numpy())
    for k in snapshot:
        assert torch.equal(first[k], snapshot[k])


class _Ticket:
    """A copy that completes only when waited for or completed by the test: then, like a
    DMA engine, it reads the host memory at its address (it holds no reference to it)."""

    def __init__(self, host: dict[str, np.ndarray], failure: BaseException | None) -> None:
        self.sources = {k: (a.ctypes.data, a.nbytes, a.dtype, a.shape) for k, a in host.items()}
        self.alive = [weakref.ref(a) for a in host.values()]
        self.result: dict[str, np.ndarray] = {}
        self.failure = failure
        self.finished = False

    def complete(self) -> None:
        if not self.finished:
            self.finished = True
            for k, (ptr, nbytes, dtype, shape) in self.sources.items():
                raw = ctypes.string_at(ptr, nbytes)
                self.result[k] = np.frombuffer(raw, dtype).reshape(shape)
        if self.failure is not None:
            raise self.failure

    def done(self) -> bool:
        if self.failure is not None and self.finished:
            raise self.failure
        return self.finished

    def wait(self) -> None:
        self.complete()


class SlowMover:
    """A copy engine that runs behind: nothing completes until the stage must wait."""

    def __init__(self, fail_start: int | None = None, fail_async: int | None = None) -> None:
        self.allocate = plain
        self.tickets: list[_Ticket] = []
        self.fail_start, self.fail_async = fail_start, fail_async

    def prepare(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return batch

    def start(self, batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], _Ticket]:
        if len(self.tickets) == self.fail_start:
            self.fail_start = None
            raise RuntimeError("copy refused")
        failure = RuntimeError("copy failed") if len(self.tickets) == self.fail_async else None
        ticket = _Ticket(batch, failure)
        self.tickets.append(ticket)
        return ticket.result, ticket

    def hand_over(self, batch: dict[str, np.ndarray], ticket: _Ticket) -> dict[str, np.ndarray]:
        return batch


def _lifetime_check() -> int:
    mover = SlowMover()
    dev = DeviceLoader(_loader(4, prefetch=6), mover, depth=3)  # type: ignore[arg-type]
    got = [next(dev) for _ in range(60)]
    for ticket in mover.tickets:
        ticket.complete()
    want = _reference(60)
    ok = all(np.array_equal(g[k], w[k]) for g, w in zip(got, want, strict=True) for k in ("x", "y"))
    dev.close()
    return OK if ok else WRONG_DATA


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child never touches JAX
def test_host_buffers_are_not_reused_before_their_copy_completed() -> None:
    # copies read host memory by address when they complete, as DMA does: a buffer
    # recycled too early shows as wrong data (or a crash, hence the child process)
    assert run_isolated(_lifetime_check, timeout=60) == OK


def test_host_batches_are_held_until_done_then_released() -> None:
    mover = SlowMover()
    with DeviceLoader(_loader(2), mover, depth=2) as dev:  # type: ignore[arg-type]
        next(dev)
        next(dev)
        delivered = mover.tickets[:2]
        assert all(r() is not None for t in delivered for r in t.alive)
        for t in delivered:
            t.complete()
        next(dev)  # the stage notices the completions and lets the buffers go
        assert all(r() is None for t in delivered for r in t.alive)
        # never more than `depth` delivered copies are left pending: the oldest is waited for
        for _ in range(6):
            next(dev)
        pending = [t for t in mover.tickets if not t.finished]
        assert len(pending) <= 2 * 2


class Flaky:
    """A stream whose gather fails on the batch holding ``bad`` while ``failing``."""

    def __init__(self, bad: int) -> None:
        self.array = DATA["x"]
        self.bad = bad
        self.failing = True

    def __len__(self) -> int:
        return N

    def __getitems__(self, indices: np.ndarray) -> np.ndarray:
        if self.failing and self.bad in indices.tolist():
            raise OSError(f"disk said no to {self.bad}")
        return self.array[indices]


@pytest.mark.parametrize(("framework", "device"), FRAMEWORKS)
def test_a_gather_error_surfaces_in_order_and_the_step_is_retried(
    framework: str, device: Any
) -> None:
    flaky = Flaky(bad=16 * 5 + 3)  # in step 5's batch (sequential sampler)
    want = _reference(9, sampler="sequential", streams={"x": DATA["x"]})
    loader = _loader(3, sampler="sequential", streams={"x": flaky})
    with to_device(loader, device, depth=3, framework=framework) as dev:  # type: ignore[arg-type]
        got = [next(dev) for _ in range(5)]
        with pytest.raises(OSError, match="disk said no") as info:
            next(dev)
        assert "__getitems__" in "".join(str(t.name) for t in info.traceback)
        assert dev.step == 5 and dev.state_dict()["step"] == 5
        with pytest.raises(OSError):  # still failing: the same step fails again
            next(dev)
        flaky.failing = False
        got += [next(dev) for _ in range(4)]
    assert_same_batches(got, want)


def test_a_copy_that_cannot_start_surfaces_at_its_batch() -> None:
    mover = SlowMover(fail_start=4)
    want = _reference(8)
    with DeviceLoader(_loader(2), mover, depth=2) as dev:  # type: ignore[arg-type]
        got = [next(dev) for _ in range(4)]
        with pytest.raises(RuntimeError, match="copy refused"):
            next(dev)
        assert dev.step == 4
        got += [next(dev) for _ in range(4)]
        for t in mover.tickets:
            t.complete()
    assert_same_batches(got, want)


def test_an_asynchronous_copy_failure_surfaces_in_next_and_the_stream_goes_on() -> None:
    mover = SlowMover(fail_async=1)
    want = _reference(12)
    with DeviceLoader(_loader(2), mover, depth=1) as dev:  # type: ignore[arg-type]
        next(dev)
        next(dev)  # its copy fails, and the stage finds out a little later
        with pytest.raises(RuntimeError, match="copy failed"):
            for _ in range(3):
                next(dev)
        at = dev.step
        rest = [next(dev) for _ in range(4)]
        for ticket in mover.tickets[2:]:
            ticket.complete()
    assert 2 <= at <= 4
    assert_same_batches(rest, want[at : at + 4])


@pytest.mark.parametrize("failing", [0, 1])
def test_seek_waits_for_every_copy_and_raises_only_a_delivered_batch_failure(
    failing: int,
) -> None:
    # batch 0 is delivered (its copy still running), batches 1 and 2 are copied ahead
    mover = SlowMover(fail_async=failing)
    with DeviceLoader(_loader(2), mover, depth=2) as dev:  # type: ignore[arg-type]
        next(dev)
        assert len(mover.tickets) == 3 and not any(t.finished for t in mover.tickets)
        if failing == 0:  # the consumer holds that batch: its copy's failure is news
            with pytest.raises(RuntimeError, match="copy failed"):
                dev.seek(5)
        else:  # a batch copied ahead is dropped, and its failure with it
            dev.seek(5)
        assert all(t.finished for t in mover.tickets[:3])  # none left running behind
        assert dev.step == 5  # the seek took effect either way: nothing is skipped unseen
        got = next(dev)
        for ticket in mover.tickets[3:]:
            ticket.complete()
        assert_same_batches([got], _reference(1, start=5))


def test_a_batch_torch_cannot_hold_is_a_copy_error_at_its_step() -> None:
    def odd(batch: dict[str, Any]) -> dict[str, Any]:
        if int(batch["y"][0]) == 16 * 3:  # step 3 of the sequential stream
            batch["bad"] = np.zeros(2, dtype="V8")
        return batch

    loader = _loader(2, sampler="sequential", transform=odd)
    with to_device(loader, "cpu", depth=2) as dev:
        for _ in range(3):
            next(dev)
        with pytest.raises(TypeError, match=r"batch key .bad. holds a numpy array of dtype .V8"):
            next(dev)
        assert dev.step == 3


@pytest.mark.parametrize(("framework", "device"), FRAMEWORKS)
def test_exact_resume_and_seek_with_copies_in_flight(framework: str, device: Any) -> None:
    want = _reference(30)
    with to_device(_loader(3), device, depth=4, framework=framework) as dev:  # type: ignore[arg-type]
        got = [next(dev) for _ in range(11)]
        state = json.loads(json.dumps(dev.state_dict()))
        assert state["step"] == 11 and dev.loader.step > 11  # the loader ran ahead
    with to_device(_loader(1), device, depth=2, framework=framework) as dev:  # type: ignore[arg-type]
        dev.load_state_dict(state)
        got += [next(dev) for _ in range(19)]
        assert_same_batches(got, want)
        dev.seek(2)
        assert dev.step == 2
        assert_same_batches([next(dev) for _ in range(3)], want[2:5])
    other = to_device(_loader(2), device, framework=framework)  # type: ignore[arg-type]
    with other as dev, pytest.raises(ValueError, match="different stream"):
        dev.load_state_dict({**state, "seed": 12})


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="depth"):
        to_device(_loader(1), "cpu", depth=0)
    with pytest.raises(TypeError):
        to_device(_loader(1), "cpu", dept=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="framework"):
        to_device(_loader(1), "cpu", framework="tf")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable"):
        to_device(object(), "cpu")
    jax_cpu = jax.devices("cpu")[0]
    with to_device(_loader(1), jax_cpu) as dev:  # a JAX device picks JAX
        assert isinstance(next(dev)["x"], jax.Array)


def test_jax_batches_go_into_a_sharding() -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    want = _reference(3)
    with to_device(_loader(2), sharding, depth=2) as dev:
        got = [next(dev) for _ in range(3)]
    assert all(b["x"].sharding == sharding for b in got)
    assert_same_batches(got, want)


def test_any_iterable_of_batches_goes_through_a_device_view() -> None:
    batches = [{"x": np.full((2, 2), i, np.float32), "tag": "b"} for i in range(5)]
    view = to_device(batches, "cpu", depth=2)
    assert isinstance(view, DeviceView) and len(view) == 5
    for _ in range(2):  # one pass per iter()
        got = list(view)
        assert [int(b["x"][0, 0]) for b in got] == list(range(5))
        assert all(b["tag"] == "b" for b in got)
    with pytest.raises(TypeError, match="no state"):
        view.state_dict()


@settings(max_examples=25, deadline=None)
@given(
    threads=st.integers(1, 4),
    depth=st.integers(1, 4),
    prefetch=st.integers(1, 5),
    ops=st.lists(
        st.one_of(
            st.just(("next", 0)),
            st.tuples(st.just("seek"), st.integers(0, 40)),
            st.just(("resume", 0)),
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_any_sequence_of_next_seek_and_resume_matches_the_cpu_loader(
    threads: int, depth: int, prefetch: int, ops: list[tuple[str, int]]
) -> None:
    reference = _loader(1)
    dev = to_device(_loader(threads, prefetch=prefetch), "cpu", depth=depth)
    try:
        for op, arg in ops:
            if op == "next":
                want, got = next(reference), next(dev)
                assert_same_batches([got], [want])
            elif op == "seek":
                reference.seek(arg)
                dev.seek(arg)
            else:  # save, drop the device loader, resume in a fresh one
                state = dev.state_dict()
                dev.close()
                dev = to_device(_loader(threads, prefetch=prefetch), "cpu", depth=depth)
                dev.load_state_dict(state)
            assert dev.step == reference.step
    finally:
        dev.close()
        reference.close()


def test_closing_closes_the_loader_and_returns_it_to_fresh_arrays() -> None:
    loader = _loader(2)
    dev = to_device(loader, "cpu")
    next(dev)
    assert loader._buffers is not None
    dev.close()
    assert loader._buffers is None
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


@pytest.mark.parametrize("last", ["partial", "pad"])
def test_an_evaluation_pass_goes_through_the_device_stage_once_in_order(last: str) -> None:
    from chute import iterate

    want = list(iterate(DATA, 50, last=last, num_threads=1))  # type: ignore[arg-type]
    with to_device(iterate(DATA, 50, last=last, num_threads=3), "cpu", depth=3) as dev:  # type: ignore[arg-type]
        got = list(dev)
        assert next(dev, None) is None  # finished, and stays so
        assert_same_batches(got, want)
        dev.seek(2)  # seek starts it again, from there
        assert_same_batches(list(dev), want[2:])
    assert sum(len(b["y"]) for b in got) >= N


def test_a_loader_feeds_one_device_stage_at_a_time() -> None:
    loader = _loader(1, sampler="sequential")
    with to_device(loader, "cpu") as first:
        with pytest.raises(chute.errors.LoaderInUseError, match="already feeds DeviceLoader"):
            to_device(loader, "cpu")
        with pytest.raises(chute.errors.LoaderInUseError):
            to_device(loader, jax.devices("cpu")[0])
        got = [next(first)["y"].tolist() for _ in range(3)]  # the whole stream, unsplit
    assert got == [list(range(s * 16, s * 16 + 16)) for s in range(3)]
    dropped = _loader(1)
    stage = to_device(dropped, "cpu")
    del stage  # a stage dropped without close() no longer holds its loader
    gc.collect()
    with to_device(dropped, "cpu") as again:
        assert next(again)["y"].shape == (16,)


def test_a_loader_feeding_a_stage_is_moved_only_through_it() -> None:
    """next / seek / load_state_dict on the loader itself would split the stream between the
    stage and the caller (the stage skipping the batches taken directly)."""
    loader = _loader(1, sampler="sequential")
    state = loader.state_dict()
    with to_device(loader, "cpu") as dev:
        first = next(dev)["y"].tolist()
        for move in (
            lambda: next(loader),
            lambda: loader.seek(0),
            lambda: loader.load_state_dict(state),
        ):
            with pytest.raises(chute.errors.LoaderInUseError, match="through that stage"):
                move()
        got = [first] + [next(dev)["y"].tolist() for _ in range(2)]
        dev.seek(0)  # the stage itself moves it
        assert next(dev)["y"].tolist() == first
    assert got == [list(range(s * 16, s * 16 + 16)) for s in range(3)]


def test_depth_is_bounded_as_prefetch_is() -> None:
    for bad in (0, -1, 257, 20_000):
        with pytest.raises(ValueError, match=r"depth must be in \[1, 256\] copies"):
            to_device(_loader(1), "cpu", depth=bad)
        with pytest.raises(ValueError, match=r"depth must be in \[1, 256\]"):
            to_device([{"x": np.arange(3)}], "cpu", depth=bad)
    for bad in (2.0, True, "2"):
        with pytest.raises(TypeError, match="depth must be an int"):
            to_device(_loader(1), "cpu", depth=bad)  # type: ignore[arg-type]
    with to_device(_loader(1), "cpu", depth=np.int64(256)) as dev:  # type: ignore[arg-type]
        assert dev.depth == 256 and next(dev)["y"].shape == (16,)


def test_worker_processes_feed_the_device_stage_in_step_order() -> None:
    want = _reference(10)
    with to_device(_loader(1, workers=2), "cpu", depth=2) as dev:
        assert_same_batches([next(dev) for _ in range(10)], want)
