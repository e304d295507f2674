"""The ``chute`` command line, run as a user would: a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import chute


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chute", *args], capture_output=True, text=True, timeout=120
    )


def test_convert_info_verify_compact(tmp_path: Path) -> None:
    a = (np.arange(500 * 64) % 17).astype(np.int16).reshape(500, 8, 8)
    np.save(tmp_path / "a.npy", a)
    out = tmp_path / "a.zr"
    r = run("convert", str(tmp_path / "a.npy"), str(out), "--codec", "zstd_dict", "-q")
    assert r.returncode == 0, r.stderr
    assert "wrote 500 records" in r.stdout
    assert np.array_equal(chute.Dataset(out)[:], a)

    r = run("info", str(out))
    assert r.returncode == 0
    assert "records:   500" in r.stdout and "zstd_dict 500" in r.stdout
    assert "int16" in r.stdout and "(8, 8)" in r.stdout

    r = run("verify", str(out))
    assert r.returncode == 0 and r.stdout.strip().endswith("0 damaged")

    with chute.RecordStore(out, mode="a") as s:
        s.delete(range(0, 500, 2))
    assert "reclaimable" in run("info", str(out)).stdout
    r = run("compact", str(out))
    assert r.returncode == 0 and "250 records" in r.stdout
    assert chute.RecordStore(out).stats()["reclaimable"] == 0


def test_verify_names_damaged_records(tmp_path: Path) -> None:
    rows = np.tile(np.arange(200, dtype=np.uint8), (10, 1))
    chute.write_dataset(tmp_path / "r.zr", rows, codec="raw")
    with open(tmp_path / "r.zr" / "0.zr", "r+b") as f:
        f.seek(200 * 6 + 3)
        f.write(b"\xff")
    r = run("verify", str(tmp_path / "r.zr"))
    assert r.returncode == 1
    assert "DAMAGED record 6" in r.stdout and "1 damaged" in r.stdout


def test_errors_are_messages_not_tracebacks(tmp_path: Path) -> None:
    r = run("info", str(tmp_path / "missing.zr"))
    assert r.returncode == 2
    assert "does not exist" in r.stderr and "Traceback" not in r.stderr
    np.save(tmp_path / "a.npy", np.zeros((2, 3)))
    chute.write_dataset(tmp_path / "b.zr", np.zeros(3))
    r = run("convert", str(tmp_path / "a.npy"), str(tmp_path / "b.zr"))
    assert r.returncode == 2 and "overwrite" in r.stderr


def test_convert_appends_and_speaks_the_command_lines_words(tmp_path: Path) -> None:
    a = np.arange(40, dtype=np.int32).reshape(10, 4)
    np.save(tmp_path / "a.npy", a)
    out = str(tmp_path / "a.zr")
    assert run("convert", str(tmp_path / "a.npy"), out, "--codec", "raw", "-q").returncode == 0
    r = run("convert", str(tmp_path / "a.npy"), out, "-q")
    assert r.returncode == 2 and "pass --append to add the rows to it or --overwrite" in r.stderr
    assert "overwrite=True" not in r.stderr
    r = run("convert", str(tmp_path / "a.npy"), out, "--append", "-q")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(chute.Dataset(out)[:], np.concatenate([a, a]))
    assert chute.Dataset(out).codec == "raw"  # appending kept the store's codec
    np.save(tmp_path / "b.npy", a.astype(np.float64))
    r = run("convert", str(tmp_path / "b.npy"), out, "--append", "-q")
    assert r.returncode == 2 and "cannot append float64" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("convert", str(tmp_path / "a.npy"), out, "--append", "--overwrite")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
