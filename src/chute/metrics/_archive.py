"""The finalized `metrics.plattli` archive: a stored (uncompressed) zip of the run folder."""

from __future__ import annotations

import os
import shutil
import zipfile

from . import _format as F


def zip_run(pdir: str, zip_path: str) -> None:
    """Write `pdir` as a stored zip at `zip_path` atomically, then remove `pdir`."""
    tmp = zip_path + F.TMP_SUFFIX
    members: list[tuple[str, str]] = []
    for root, _dirs, files in os.walk(pdir):
        for fn in files:
            if fn.endswith(F.TMP_SUFFIX):
                continue
            full = os.path.join(root, fn)
            members.append((os.path.relpath(full, pdir).replace(os.sep, "/"), full))
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for arc, full in sorted(members):
            zf.write(full, arc)
    os.replace(tmp, zip_path)
    shutil.rmtree(pdir)


def check_members(zip_path: str) -> list[str]:
    """Member names of a run archive, rejecting any that would escape the run folder."""
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
    for n in names:
        parts = n.split("/")
        if n.startswith("/") or "\\" in n or "\0" in n or any(p in ("..",) for p in parts):
            raise ValueError(f"archive {zip_path} has an unsafe member path {n!r}")
    return names


def unzip_run(zip_path: str, pdir: str) -> None:
    """Extract a finalized run back into `pdir` for resuming, then remove the archive."""
    check_members(zip_path)
    staging = pdir + F.TMP_SUFFIX
    if os.path.exists(staging):
        shutil.rmtree(staging)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(staging)
    if os.path.exists(pdir):
        shutil.rmtree(pdir)
    os.replace(staging, pdir)
    os.unlink(zip_path)
