"""The built distribution works on its own: sdist -> wheel -> a fresh venv, no source tree.

An editable install hides what only the source tree has (a header missing from the sdist, a
package-data file left out of the wheel, a build step that only runs in place); this test
builds the sdist, builds the wheel *from the sdist* (as ``python -m build`` does), installs it
into an empty venv and runs a smoke script from a folder outside the checkout, in isolated
mode, so nothing from ``src/`` can be imported by accident.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SMOKE = r"""
import json, os, subprocess, sys, tempfile
from pathlib import Path
import numpy as np
import chute
from chute.metrics import DirectWriter, Reader

here = Path(chute.__file__).resolve()
assert "site-packages" in here.parts, here
assert (here.parent / "py.typed").is_file()
stubs = sorted(p.name for p in (here.parent / "_native").glob("*.pyi"))
assert stubs == ["_curves.pyi", "_sampler.pyi", "_zrecord.pyi"], stubs

tmp = Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
images = rng.integers(0, 4, (300, 8, 8), dtype=np.uint8)
for codec in ("raw", "zstd", "zstd_dict"):
    ds = chute.write_dataset(tmp / f"{codec}.zr", images, codec=codec, dict_size=2048)
    assert np.array_equal(ds[::-1], images[::-1]), codec
    assert ds.store.verify()["damaged"] == []
    ds.close()
labels = chute.write_dataset(tmp / "labels.zr", np.arange(300, dtype=np.int32))
streams = {"x": chute.Dataset(tmp / "zstd.zr"), "y": labels}
with chute.DataLoader(streams, batch_size=32, seed=1) as dl:
    state = dl.state_dict()
    a = [next(dl)["y"].tolist() for _ in range(3)]
    dl.load_state_dict(state)
    assert [next(dl)["y"].tolist() for _ in range(3)] == a
w = DirectWriter(tmp / "run", config={"smoke": True})
for step in range(5):
    w.write(loss=1.0 / (step + 1)); w.end_step()
w.finish()
with Reader(tmp / "run") as r:
    assert r.metric("loss")[0].tolist() == [0, 1, 2, 3, 4]
cli = Path(sys.executable).with_name("chute")
info = [str(cli), "info", str(tmp / "zstd_dict.zr")]
out = subprocess.run(info, check=True, capture_output=True, text=True).stdout
assert "300" in out, out
print("smoke ok")
"""


def _run(*cmd: str | os.PathLike[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [os.fspath(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sdist and the wheel built from it (the build runs without isolation, for speed)."""
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    return out


def test_sdist_holds_the_sources(dist: Path) -> None:
    (sdist,) = dist.glob("chute-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    native = {p.relative_to(ROOT).as_posix() for p in (ROOT / "src/chute/_native").glob("*.[ch]")}
    assert native <= names, f"missing from the sdist: {sorted(native - names)}"
    assert {"pyproject.toml", "setup.py", "README.md"} <= names


def test_wheel_installs_and_runs_outside_the_tree(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("chute-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "chute/py.typed" in names
    static = ROOT / "src/chute/metrics/dashboard/static"
    for path in static.glob("*") if static.is_dir() else ():
        assert f"chute/metrics/dashboard/static/{path.name}" in names, path.name
    assert any(n.startswith("chute/_native/_zrecord.") and n.endswith(".so") for n in names)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    _run(py, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = _run(py, "-I", "-c", SMOKE, cwd=work, env=env)
    assert "smoke ok" in out
