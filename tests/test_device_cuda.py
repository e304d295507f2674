"""The device stage on a real GPU (skipped without CUDA): pinned ring, streams, events.

The CPU tests (tests/test_device.py) cover the ring, order, errors and resume everywhere;
these check what only a GPU has: page-locked host buffers, copies on a side stream that
the consumer's stream waits for, and memory that stays valid under the consumer's kernels.

A missing wait shows only when the copies run late: the races are forced by stalling a
stream with ``torch.cuda._sleep`` while copies are queued, with copies of megabytes. The
batches are compared on the GPU against references uploaded beforehand, and mismatches
summed on the device: one synchronisation at the end, none per step (a ``.cpu()`` per step
would wait for everything and hide the races).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from chute import DataLoader
from chute.frameworks import to_device

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 512
WIDTH = 32768  # 64 rows x 32768 float32: 8 MiB per batch
DATA: dict[str, np.ndarray] = {
    "x": np.arange(N * WIDTH, dtype=np.float32).reshape(N, WIDTH),
    "y": np.arange(N),
}
STALL = 20_000_000  # GPU clock cycles a stalled stream sleeps: about 10 ms


def _loader(threads: int, **kw: Any) -> DataLoader:
    return DataLoader(DATA, batch_size=64, sampler="iid", seed=3, num_threads=threads, **kw)


def _uploaded(steps: int) -> list[dict[str, Any]]:
    """The CPU loader's first ``steps`` batches, already on the GPU (synchronised once)."""
    with _loader(1) as ref:
        want = [{k: torch.from_numpy(v).cuda() for k, v in next(ref).items()} for _ in range(steps)]
    torch.cuda.synchronize()
    return want


def _mismatches(batch: dict[str, Any], want: dict[str, Any], count: Any) -> None:
    """Add the differing elements of ``batch`` to ``count``, queued on the current stream."""
    for k in want:
        count += (batch[k] != want[k]).sum()


def test_cuda_batches_match_the_cpu_loader_under_a_busy_consumer() -> None:
    want = _uploaded(40)
    busy = torch.randn(2048, 2048, device="cuda")
    count = torch.zeros((), dtype=torch.int64, device="cuda")
    with to_device(_loader(4), "cuda", depth=3) as dev:
        for step in range(40):
            batch = next(dev)
            assert batch["x"].device.type == "cuda"
            for _ in range(3):  # keep the consumer's stream busy while copies run
                busy = busy @ busy / busy.norm()
            _mismatches(batch, want[step], count)
    assert int(count) == 0


def test_a_stalled_copy_stream_still_delivers_complete_batches() -> None:
    """The copies run late (each queued behind a sleep on the copy stream): a consumer
    that did not wait for a batch's event would read it before its copy, and a host buffer
    recycled before its copy completed would be gathered over while the DMA reads it."""
    want = _uploaded(30)
    count = torch.zeros((), dtype=torch.int64, device="cuda")
    with to_device(_loader(4), "cuda", depth=3) as dev:
        side = dev.mover._stream  # type: ignore[attr-defined]
        for step in range(30):
            with torch.cuda.stream(side):
                torch.cuda._sleep(STALL)  # the next copy is queued behind this
            batch = next(dev)
            _mismatches(batch, want[step], count)
    assert int(count) == 0


def test_a_stalled_consumer_keeps_the_memory_of_batches_it_dropped() -> None:
    """The consumer's kernels run late (behind a sleep on its stream) and it drops each
    batch at once: without ``record_stream`` the allocator would give that memory to a
    later copy on the copy stream before the consumer's kernels read it."""
    want = _uploaded(30)
    count = torch.zeros((), dtype=torch.int64, device="cuda")
    with to_device(_loader(4), "cuda", depth=2) as dev:
        for step in range(30):
            batch = next(dev)
            torch.cuda._sleep(STALL)
            _mismatches(batch, want[step], count)
            del batch
    assert int(count) == 0


def test_a_leaf_a_transform_put_on_the_gpu_is_waited_for_and_not_copied() -> None:
    """The transform (on a loader thread, so on the default stream) makes a GPU tensor
    behind a sleep; the consumer works on a stream of its own. Its batch must show the
    finished tensor: the copy stream waited for the default stream before the event the
    consumer waits on. The tensor is handed over as it is, not copied."""
    made: dict[int, int] = {}

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        first = int(batch["y"][0])
        torch.cuda._sleep(STALL)
        batch["tag"] = torch.full((1024,), float(first), device="cuda")
        made[first] = batch["tag"].data_ptr()
        return batch

    want = _uploaded(12)
    count = torch.zeros((), dtype=torch.int64, device="cuda")
    consumer = torch.cuda.Stream()
    passed_through = []
    with to_device(_loader(2, transform=transform), "cuda", depth=2) as dev:
        with torch.cuda.stream(consumer):
            for step in range(12):
                batch = next(dev)
                tag = want[step]["y"][0].to(torch.float32).expand(1024)
                count += (batch["tag"] != tag).sum()
                _mismatches(batch, want[step], count)
                passed_through.append(batch["tag"].data_ptr())
        consumer.synchronize()
    assert int(count) == 0
    assert set(passed_through) <= set(made.values())


def test_the_ring_is_page_locked_and_the_copies_run_on_a_side_stream() -> None:
    loader = _loader(2)
    with to_device(loader, "cuda:0", depth=2) as dev:
        next(dev)
        ring = loader._buffers
        assert ring is not None
        roots = list(ring._held)
        assert roots and all(torch.from_numpy(r).is_pinned() for r in roots)
        assert dev.mover._stream != torch.cuda.current_stream()  # type: ignore[attr-defined]


def test_jax_on_the_gpu_matches_the_cpu_loader() -> None:
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX has no GPU backend here")
    from chute.frameworks import DeviceLoader
    from chute.frameworks._jax import JaxMover

    pinned = any(m.kind == "pinned_host" for m in gpus[0].addressable_memories())
    assert (JaxMover(gpus[0])._staging is not None) == pinned  # staged where offered
    with _loader(1) as ref:
        want = [next(ref) for _ in range(10)]
    for stage in (True, False) if pinned else (False,):
        with DeviceLoader(_loader(3), JaxMover(gpus[0], stage=stage), depth=2) as dev:
            got = [next(dev) for _ in range(10)]
        for g, w in zip(got, want, strict=True):
            assert g["x"].sharding.memory_kind == "device"
            np.testing.assert_array_equal(np.asarray(g["x"]), w["x"])
            np.testing.assert_array_equal(np.asarray(g["y"]), w["y"])
