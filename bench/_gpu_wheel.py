"""Make chute's locally built wheel a manylinux wheel for the GPU machine (bench/gpu-wheels.sh).

``python bench/_gpu_wheel.py WHEEL`` checks every compiled module in the wheel: the shared
libraries it needs must be glibc's or ``libzstd.so.1`` (linked from the system at run time,
not bundled), and the newest glibc symbol version it uses sets the tag,
``manylinux_2_<N>_x86_64``. The wheel is then renamed and its ``WHEEL`` file (and that
file's line in ``RECORD``) rewritten to that tag; the new path is printed. Needs ``readelf``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ALLOWED = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "libzstd.so.1",
}
"""What a compiled module may need: glibc's libraries, and the system's libzstd."""


def needs(so: Path) -> tuple[set[str], tuple[int, int]]:
    """The libraries ``so`` needs and the newest glibc symbol version it uses."""
    dynamic = subprocess.run(["readelf", "-dW", str(so)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    libraries = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    versions = subprocess.run(["readelf", "-VW", str(so)], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    found = [(int(a), int(b)) for a, b in re.findall(r"GLIBC_(\d+)\.(\d+)", versions)]
    return libraries, max(found, default=(2, 17))


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def retag(wheel: Path, platform: str) -> Path:
    """A copy of ``wheel`` tagged for ``platform`` (the original is removed)."""
    stem = wheel.name.removesuffix(".whl")
    parts = stem.split("-")
    if parts[-1] != "linux_x86_64":
        raise SystemExit(f"{wheel.name}: expected a linux_x86_64 wheel from a local build")
    target = wheel.with_name("-".join([*parts[:-1], platform]) + ".whl")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        text = src.read(info).decode().replace("-linux_x86_64", f"-{platform}")
        wheel_file = text.encode()
        for name in names:
            if name == info:
                dst.writestr(name, wheel_file)
            elif name == record:
                lines = [
                    _record_line(info, wheel_file) if line.split(",")[0] == info else line
                    for line in src.read(name).decode().splitlines()
                ]
                dst.writestr(name, "\n".join(lines) + "\n")
            else:
                dst.writestr(src.getinfo(name), src.read(name))
    wheel.unlink()
    return target


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    wheel = Path(sys.argv[1])
    newest = (2, 17)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        modules = [n for n in zf.namelist() if n.endswith(".so")]
        if not modules:
            raise SystemExit(f"{wheel.name} holds no compiled module")
        for name in modules:
            so = Path(zf.extract(name, tmp))
            libraries, version = needs(so)
            foreign = sorted(libraries - ALLOWED)
            if foreign:
                raise SystemExit(f"{name} needs {', '.join(foreign)}: not on every machine")
            newest = max(newest, version)
            print(f"  {name}: needs {', '.join(sorted(libraries))}; "
                  f"glibc >= {version[0]}.{version[1]}", file=sys.stderr)  # fmt: skip
    print(retag(wheel, f"manylinux_{newest[0]}_{newest[1]}_x86_64"))


if __name__ == "__main__":
    main()
