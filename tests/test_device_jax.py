"""The JAX device stage on CPU: one transfer per batch, host work on the loader's threads,
pinned staging where the backend offers it, and shardings over a mesh and over processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute import DataLoader
from chute.frameworks import DeviceLoader, to_device
from tests.batches_util import assert_same_batches

jax = pytest.importorskip("jax")

N = 240
DATA: dict[str, np.ndarray] = {
    "x": np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3),
    "y": np.arange(N, dtype=np.int32),
    "ids": np.arange(N, dtype=np.int64) * 3,
}
ROOT = Path(__file__).resolve().parents[1]


def _loader(threads: int = 2, **kw: Any) -> DataLoader:
    return DataLoader(DATA, batch_size=16, sampler="iid", seed=11, num_threads=threads, **kw)


def _reference(n: int) -> list[dict[str, np.ndarray]]:
    with _loader(1) as dl:
        return [next(dl) for _ in range(n)]


@pytest.mark.filterwarnings("ignore:JAX has 64-bit types off")
def test_one_transfer_per_batch_and_the_narrowing_on_the_loader_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chute.frameworks import _jax

    puts: list[int] = []
    put = jax.device_put

    def counting(x: Any, *args: Any, **kwargs: Any) -> Any:
        puts.append(len(x) if isinstance(x, list) else 1)
        return put(x, *args, **kwargs)

    fitted_on: list[str] = []
    fit = _jax.fit_x64

    def spying(array: np.ndarray, narrowed: set[np.dtype[Any]]) -> np.ndarray:
        fitted_on.append(threading.current_thread().name)
        return fit(array, narrowed)

    monkeypatch.setattr(jax, "device_put", counting)
    monkeypatch.setattr(_jax, "fit_x64", spying)
    with to_device(_loader(3), jax.devices("cpu")[0], depth=2) as dev:
        got = [next(dev) for _ in range(10)]
    assert puts == [3] * 12  # x, y and ids in one call per batch (two copied ahead)
    assert got[0]["ids"].dtype == np.int32  # narrowed, as x64 is off
    assert fitted_on and all(name.startswith("chute-loader") for name in fitted_on)
    assert_same_batches(got, _reference(10))


def test_pinned_staging_is_off_on_cpu_and_works_where_forced() -> None:
    from chute.frameworks._jax import JaxMover

    cpu = jax.devices("cpu")[0]
    assert JaxMover(cpu)._staging is None  # pinned host memory buys nothing on a CPU
    mover = JaxMover(cpu, stage=True)
    staged = mover.prepare({"x": DATA["x"][:4], "y": DATA["y"][:4]})
    assert {a.sharding.memory_kind for a in staged.values()} == {"pinned_host"}
    with DeviceLoader(_loader(2), mover, depth=2) as dev:
        got = [next(dev) for _ in range(6)]
    assert {b["x"].sharding.memory_kind for b in got} == {"device"}
    assert_same_batches(got, _reference(6))


class _Memory:
    def __init__(self, kind: str) -> None:
        self.kind = kind


class _Device:
    def __init__(self, platform: str, kinds: tuple[str, ...] | None) -> None:
        self.platform, self.kinds = platform, kinds

    def addressable_memories(self) -> list[_Memory]:
        if self.kinds is None:
            raise NotImplementedError("this backend has no memory spaces")
        return [_Memory(k) for k in self.kinds]


class _Sharding:
    def __init__(self, *devices: _Device, memory_kind: str | None = "device") -> None:
        self.addressable_devices, self.memory_kind = list(devices), memory_kind


def test_pinned_staging_is_chosen_only_where_the_backend_offers_it() -> None:
    from chute.frameworks._jax import _offers_pinned_host

    gpu = _Device("gpu", ("device", "pinned_host", "unpinned_host"))
    assert _offers_pinned_host(_Sharding(gpu, gpu))
    assert _offers_pinned_host(_Sharding(gpu, memory_kind=None))
    assert not _offers_pinned_host(_Sharding(gpu, memory_kind="pinned_host"))  # host already
    assert not _offers_pinned_host(_Sharding(gpu, _Device("gpu", ("device",))))
    assert not _offers_pinned_host(_Sharding(_Device("cpu", ("device", "pinned_host"))))
    assert not _offers_pinned_host(_Sharding(_Device("tpu", None)))  # cannot say: no
    assert not _offers_pinned_host(object())


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return out


def test_a_mesh_of_eight_cpu_devices_gets_whole_batches_sharded() -> None:
    proc = _run("""
        import warnings; warnings.simplefilter("ignore")
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from chute import DataLoader
        from chute.frameworks import to_device
        from chute.frameworks._jax import JaxMover
        assert len(jax.devices()) == 8
        mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("batch", "model"))
        sharding = NamedSharding(mesh, P("batch"))
        data = {"x": np.arange(240 * 6, dtype=np.float32).reshape(240, 6),
                "y": np.arange(240, dtype=np.int32)}
        make = lambda: DataLoader(data, batch_size=16, sampler="iid", seed=3, num_threads=2)
        with make() as ref:
            want = [next(ref) for _ in range(8)]
        with to_device(make(), sharding, depth=2) as dev:
            got = [next(dev) for _ in range(8)]
        for g, w in zip(got, want):
            for k in w:
                assert g[k].sharding == sharding and len(g[k].addressable_shards) == 8
                np.testing.assert_array_equal(np.asarray(g[k]), w[k])
                for shard in g[k].addressable_shards:
                    np.testing.assert_array_equal(np.asarray(shard.data), w[k][shard.index])
        assert JaxMover(sharding)._local is False  # one process holds every device
        print("ok")
    """)
    assert _finish(proc).split() == ["ok"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("stage", [False, True])
def test_two_processes_each_load_their_slice_of_the_global_batch(stage: bool) -> None:
    """Multi-host on one machine: two processes of 4 CPU devices each, one mesh over the 8.
    Each loads its ``shard=`` half of the global batch; `device_put` of that into the
    global sharding fails (it checks every process passes the same value), the device
    stage builds the global arrays with ``make_array_from_process_local_data``."""
    code = f"""
        import sys, warnings; warnings.simplefilter("ignore")
        import jax, numpy as np
        process = int(sys.argv[1])
        jax.distributed.initialize("127.0.0.1:{_free_port()}", num_processes=2,
                                   process_id=process)
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from chute import DataLoader
        from chute.frameworks import DeviceLoader
        from chute.frameworks._jax import JaxMover
        mesh = Mesh(np.array(jax.devices()), ("batch",))
        sharding = NamedSharding(mesh, P("batch"))
        assert not sharding.is_fully_addressable and jax.local_device_count() == 4
        data = {{"x": np.arange(240 * 6, dtype=np.float32).reshape(240, 2, 3),
                 "y": np.arange(240, dtype=np.int32)}}
        def make(shard):
            return DataLoader(data, batch_size=16, sampler="iid", seed=5, num_threads=2,
                              shard=shard)
        with make(None) as ref:
            want = [next(ref) for _ in range(6)]
        mover = JaxMover(sharding, stage={stage})
        with DeviceLoader(make((process, 2)), mover, depth=2) as dev:
            got = [next(dev) for _ in range(6)]
        for g, w in zip(got, want):  # checked once all are delivered: none was overwritten
            for k in w:
                assert g[k].shape == w[k].shape and g[k].sharding == sharding
                assert len(g[k].addressable_shards) == 4
                for shard in g[k].addressable_shards:
                    np.testing.assert_array_equal(np.asarray(shard.data), w[k][shard.index])
        print("ok", process)
        jax.distributed.shutdown()
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(process)],
            cwd=ROOT,
            env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for process in (0, 1)
    ]
    outs = [_finish(p) for p in procs]
    assert [o.split() for o in outs] == [["ok", "0"], ["ok", "1"]]
