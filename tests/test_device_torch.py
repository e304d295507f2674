"""The torch CUDA path on any machine: a stand-in for ``torch.cuda`` logs the streams,
waits and events the device stage uses, and meta tensors play the GPU's. What only a real
GPU shows (data arriving complete under stalled streams) is in tests/test_device_cuda.py."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

from chute import DataLoader
from chute.frameworks import DeviceLoader

torch = pytest.importorskip("torch")

DATA: dict[str, np.ndarray] = {
    "x": np.arange(240 * 6, dtype=np.float32).reshape(240, 2, 3),
    "y": np.arange(240),
}


class _FakeStream:
    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _FakeStream) -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: _FakeEvent) -> None:
        self.log.append(("wait_event", self.name, str(event.id)))


class _FakeEvent:
    def __init__(self, id: int, log: list[tuple[str, ...]]) -> None:
        self.id, self.log, self.polls = id, log, 0

    def record(self, stream: _FakeStream) -> None:
        self.polls = 0
        self.log.append(("record", stream.name, str(self.id)))

    def query(self) -> bool:  # the copy completes by the second look
        self.polls += 1
        return self.polls > 1

    def synchronize(self) -> None:
        self.polls = 2
        self.log.append(("synchronize", str(self.id)))


class FakeCuda:
    """What TorchMover uses of ``torch.cuda``, logging each call; ``stream()`` switches the
    current stream as torch's does."""

    def __init__(self, consumer_is_default: bool = False) -> None:
        self.log: list[tuple[str, ...]] = []
        self.events: list[tuple[_FakeEvent, dict[str, Any]]] = []
        self.default = _FakeStream("default", self.log)
        self.current = self.default if consumer_is_default else _FakeStream("consumer", self.log)

    def Stream(self, device: Any) -> _FakeStream:  # torch's names
        return _FakeStream("side", self.log)

    def Event(self, **options: Any) -> _FakeEvent:
        event = _FakeEvent(len(self.events), self.log)
        self.events.append((event, options))
        return event

    def default_stream(self, device: Any) -> _FakeStream:
        return self.default

    def current_stream(self, device: Any) -> _FakeStream:
        return self.current

    def stream(self, stream: _FakeStream) -> Any:
        @contextlib.contextmanager
        def switched() -> Any:
            before, self.current = self.current, stream
            try:
                yield
            finally:
                self.current = before

        return switched()


def _fake_cuda_loader(cuda: FakeCuda, depth: int, on_device: dict[int, Any]) -> DeviceLoader:
    from chute.frameworks._torch import TorchMover

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        step = int(batch["y"][0]) // 16
        if step % 2 == 0:  # every other step: a leaf already on the "GPU"
            batch["mask"] = on_device[step] = torch.ones(16, device="meta")
        return batch

    loader = DataLoader(DATA, batch_size=16, sampler="sequential", transform=transform)
    return DeviceLoader(loader, TorchMover("meta", cuda=cuda), depth=depth)


@pytest.mark.parametrize("depth", [1, 3])
def test_cuda_events_are_blocking_and_reused_not_made_per_batch(depth: int) -> None:
    cuda = FakeCuda()
    with _fake_cuda_loader(cuda, depth, {}) as dev:
        for _ in range(40):
            batch = next(dev)
            assert batch["x"].device.type == "meta"
    assert all(options == {"blocking": True} for _, options in cuda.events)
    assert 1 <= len(cuda.events) <= 2 * depth + 2  # events in flight at once, then reused
    records = [entry for entry in cuda.log if entry[0] == "record"]
    assert len(records) == 40 + depth  # one per batch, the ones copied ahead included
    handed = [entry for entry in cuda.log if entry[0] == "wait_event"]
    assert [entry[1] for entry in handed] == ["consumer"] * 40  # each batch, on its stream


@pytest.mark.parametrize("consumer_is_default", [False, True])
def test_a_leaf_already_on_the_device_is_waited_for_then_handed_over_as_is(
    consumer_is_default: bool,
) -> None:
    cuda = FakeCuda(consumer_is_default)
    on_device: dict[int, Any] = {}
    with _fake_cuda_loader(cuda, 2, on_device) as dev:
        got = [next(dev) for _ in range(6)]
    assert [("mask" in b) for b in got] == [True, False] * 3
    assert all(got[step]["mask"] is on_device[step] for step in (0, 2, 4))  # not copied
    assert all(b["x"].device.type == "meta" for b in got)  # the host leaves were
    # per batch: the copy stream waits for the streams such a leaf can come from (queried
    # before it became current), then records the batch's event; none for host-only ones
    batches: list[list[tuple[str, ...]]] = [[]]
    for entry in cuda.log:
        if entry[0] == "record":
            batches.append([])
        elif entry[0] == "wait_stream":
            batches[-1].append(entry)
    producers = [("wait_stream", "side", "default")]
    if not consumer_is_default:
        producers.append(("wait_stream", "side", "consumer"))
    assert batches[:6] == [producers, [], producers, [], producers, []]


def test_the_cpu_stage_names_the_key_torch_cannot_hold_and_copies_flipped_leaves() -> None:
    from chute.frameworks import to_device

    names = np.array([b"ab"] * 8, "S2")
    streams = {"image": np.arange(8 * 9, dtype=np.uint8).reshape(8, 3, 3), "name": names}
    loader = DataLoader(streams, batch_size=4, sampler="sequential")
    with (
        to_device(loader, "cpu") as dev,
        pytest.raises(TypeError, match=r"batch key 'name'.*S2.*view it as uint8"),
    ):
        next(dev)
    flip = DataLoader(
        {"image": streams["image"]}, batch_size=4, sampler="sequential",
        transform=lambda b: {"image": b["image"][:, :, ::-1]},
    )  # fmt: skip
    flipped = torch.from_numpy(streams["image"][:4, :, ::-1].copy())
    with to_device(flip, "cpu") as dev:
        assert torch.equal(next(dev)["image"], flipped)
