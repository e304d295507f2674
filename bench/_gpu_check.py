"""The imports the GPU run needs, checked before anything is measured (bench/gpu-run.sh).

``python bench/_gpu_check.py [--cpu-smoke]`` prints one line per module (its version and
where it was found, or what is missing and what that costs) and exits 1 if the run cannot
go on: chute or its compiled core missing, or (without ``--cpu-smoke``) torch missing or
seeing no CUDA device. A missing peer only costs its rows, which then say skipped. JAX is
imported in a process of its own with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, as the
benchmark runs it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from typing import Any

REQUIRED = ["numpy", "chute", "chute._native._zrecord", "chute._native._sampler",
            "chute._native._curves"]  # fmt: skip
OPTIONAL = {
    "loaderx": "the loaderx row",
    "cffi": "the loaderx row (loaderx needs it)",
    "zarr": "the chute.insitu rows",
    "numcodecs": "the chute.insitu rows (zarr needs it)",
    "donfig": "the chute.insitu rows (zarr needs it)",
    "google_crc32c": "the chute.insitu rows (zarr needs it)",
    "obstore": "the chute.insitu rows",
    "pytest": "the CUDA stress test (tests/test_device_cuda.py)",
}
CARRY = "carry its wheel: `make gpu-wheels` here, then .gpuwheels in the run's carry list"


def check(name: str) -> tuple[Any, str]:
    """The module (or None) and a line about it."""
    try:
        module = importlib.import_module(name)
    except Exception as error:  # ImportError, or an OSError from a missing shared library
        return None, f"{type(error).__name__}: {error}"
    top = sys.modules[name.split(".")[0]]
    version = getattr(top, "__version__", "")
    return module, f"{version} ({getattr(module, '__file__', '?')})"


def jax_line(smoke: bool) -> tuple[bool, str]:
    """Whether JAX imports (and, for a GPU run, has a GPU backend), asked in its own process."""
    code = (
        "import json, jax\n"
        "out = {'version': jax.__version__, 'devices': [str(d) for d in jax.devices()]}\n"
        "try:\n    out['gpu'] = [str(d) for d in jax.devices('gpu')]\n"
        "except RuntimeError as e:\n    out['gpu'] = 'none: ' + str(e)[:120]\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, "import timed out after 120 s"
    if done.returncode != 0:
        return False, "does not import: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    has_gpu = isinstance(info["gpu"], list)
    return smoke or has_gpu, f"{info['version']}, devices {info['devices']}, GPU {info['gpu']}"


def main() -> None:
    smoke = "--cpu-smoke" in sys.argv[1:]
    fatal: list[str] = []
    print(f"Python {sys.version.split()[0]} at {sys.executable}")
    for name in REQUIRED:
        module, line = check(name)
        print(f"{'ok' if module else 'MISSING':<8} {name} {line}")
        if module is None:
            fatal.append(f"{name} ({line})")
    for name, cost in OPTIONAL.items():
        module, line = check(name)
        if module:
            print(f"ok       {name} {line}")
        else:
            print(f"MISSING  {name}: {line}\n         costs {cost}; {CARRY}")
    torch, line = check("torch")
    if torch is None:
        print(f"MISSING  torch: {line}")
        if not smoke:
            fatal.append("torch")
    else:
        cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name() if cuda else "no CUDA device"
        print(f"ok       torch {line}; CUDA {torch.version.cuda}: {gpu}")
        if not smoke and not cuda:
            fatal.append("a CUDA device seen by torch")
    ok, line = jax_line(smoke)
    print(f"{'ok' if ok else 'NO GPU':<8} jax {line}" + ("" if ok else ": the JAX row skips"))
    if fatal:
        sys.exit("the GPU run cannot go on without: " + "; ".join(fatal))
    print("imports: everything the run needs is there")


if __name__ == "__main__":
    main()
