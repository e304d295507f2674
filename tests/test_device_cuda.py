"""The device stage on a real GPU (skipped without CUDA): pinned ring, streams, events.

The CPU tests (tests/test_device.py) cover the ring, order, errors and resume everywhere;
these check what only a GPU has: page-locked host buffers, copies on a side stream that
the consumer's stream waits for, and memory that stays valid under the consumer's kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from chute import DataLoader
from chute.frameworks import to_device

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 512
DATA = {"x": np.arange(N * 4096, dtype=np.float32).reshape(N, 4096), "y": np.arange(N)}


def _loader(threads: int) -> DataLoader:
    return DataLoader(DATA, batch_size=64, sampler="iid", seed=3, num_threads=threads)


def test_cuda_batches_match_the_cpu_loader_under_a_busy_consumer() -> None:
    with _loader(1) as ref:
        want = [next(ref) for _ in range(40)]
    busy = torch.randn(2048, 2048, device="cuda")
    with to_device(_loader(4), "cuda", depth=3) as dev:
        got = []
        for _ in range(40):
            batch = next(dev)
            assert batch["x"].device.type == "cuda"
            for _ in range(3):  # keep the consumer's stream busy while copies run
                busy = busy @ busy / busy.norm()
            got.append({k: (v * 1).cpu().numpy() for k, v in batch.items()})
    torch.cuda.synchronize()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["x"], w["x"])
        np.testing.assert_array_equal(g["y"], w["y"])


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
    with _loader(1) as ref:
        want = [next(ref) for _ in range(10)]
    with to_device(_loader(3), gpus[0], depth=2) as dev:
        got = [next(dev) for _ in range(10)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g["x"]), w["x"])
