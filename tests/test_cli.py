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


def test_info_and_verify_take_several_stores_and_json(tmp_path: Path) -> None:
    import json

    chute.write_dataset(tmp_path / "a.zr", np.zeros((30, 64), np.uint8)).close()
    chute.write_dataset(tmp_path / "b.zr", np.ones((20, 64), np.uint8), codec="raw").close()
    a, b, missing = (str(tmp_path / n) for n in ("a.zr", "b.zr", "missing.zr"))
    r = run("info", a, b)
    assert r.returncode == 0 and f"== {a}" in r.stdout and f"== {b}" in r.stdout
    assert "table:" in r.stdout and "checksums:" in r.stdout and "on disk:" in r.stdout
    r = run("info", "--json", a, b)
    docs = json.loads(r.stdout)
    assert [d["records"] for d in docs] == [30, 20]
    on_disk = sum(f.stat().st_blocks * 512 for f in (tmp_path / "b.zr").iterdir())
    assert docs[1]["disk_bytes"] == on_disk
    assert docs[1]["table_bytes"] == (tmp_path / "b.zr" / "meta.zr").stat().st_size
    assert docs[1]["checksum_bytes"] == (tmp_path / "b.zr" / "crc32c.chute").stat().st_size
    r = run("verify", "--json", a, missing, b)
    assert r.returncode == 2  # one path failed; the others were still checked
    docs = json.loads(r.stdout)
    assert [d.get("checked") for d in docs] == [30, None, 20]
    assert "does not exist" in docs[1]["error"] and "missing.zr" in r.stderr
    with open(tmp_path / "b.zr" / "0.zr", "r+b") as f:
        f.seek(64 * 3)
        f.write(b"\x07")
    r = run("verify", "-q", a, b)
    assert r.returncode == 1 and r.stderr == ""
    assert "DAMAGED record 3" in r.stdout and "19 matched their checksum" in r.stdout


def test_progress_on_the_command_line_and_quiet(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((300, 1024), np.uint8))
    r = run("convert", str(tmp_path / "a.npy"), str(tmp_path / "a.zr"))
    assert r.returncode == 0 and "MiB" in r.stderr and "write a.zr" in r.stderr
    r = run("verify", str(tmp_path / "a.zr"))
    assert r.returncode == 0 and "verify a.zr" in r.stderr and "MiB" in r.stderr
    with chute.RecordStore(tmp_path / "a.zr", mode="a") as s:
        s.delete(range(0, 300, 2))
    r = run("compact", str(tmp_path / "a.zr"))
    assert r.returncode == 0 and "compact a.zr" in r.stderr
    r = run("compact", "-q", str(tmp_path / "a.zr"))
    assert r.returncode == 0 and r.stderr == ""


def test_zstd_level_out_of_range_is_an_error(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((3, 8), np.uint8))
    r = run("convert", str(tmp_path / "a.npy"), str(tmp_path / "a.zr"), "--level", "99")
    assert r.returncode == 2 and "level must be an integer zstd level" in r.stderr
    assert not (tmp_path / "a.zr").exists()


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


def test_compact_never_makes_a_store(tmp_path: Path) -> None:
    """`compact` of a path that holds no store is an error, and writes nothing there."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    for path in (tmp_path / "a" / "b", tmp_path / "notes"):
        done = run("compact", "-q", str(path))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "a").exists()
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["notes.txt"]


def test_convert_refuses_what_it_cannot_store_and_names_the_file(tmp_path: Path) -> None:
    import os

    np.save(tmp_path / "s.npy", np.zeros(2, [("a", "<i4"), ("b", "<f8")]))
    (tmp_path / "t.npy").write_text("not numpy at all")
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], object), allow_pickle=True)
    os.mkfifo(tmp_path / "f.npy")  # would block a reader for ever
    for name, words in (("s.npy", "structured"), ("t.npy", "t.npy: not a .npy file"),
                        ("o.npy", "o.npy: not a .npy array of plain data"),
                        ("f.npy", "f.npy: not a regular file")):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "chute", "convert", "-q", str(tmp_path / name),
             str(tmp_path / ("out-" + name))],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and words in done.stderr, (name, done.stderr)
        assert "Traceback" not in done.stderr and "pickle" not in done.stderr


def test_info_of_a_chunk_cut_short_says_damaged_not_negative_garbage(tmp_path: Path) -> None:
    import json

    chute.write_dataset(tmp_path / "s", np.arange(4000, dtype=np.int64).reshape(100, 40),
                        codec="raw").close()  # fmt: skip
    with open(tmp_path / "s" / "0.zr", "r+b") as f:
        f.truncate(f.seek(0, 2) - 1000)
    text = run("info", str(tmp_path / "s"))
    assert "DAMAGED" in text.stdout and "-0.00" not in text.stdout
    (report,) = json.loads(run("info", "--json", str(tmp_path / "s")).stdout)
    assert report["reclaimable"] == 0 and report["short_bytes"] == 1000


def test_compacting_a_sharded_dataset_shows_progress(tmp_path: Path) -> None:
    chute.write_dataset(tmp_path / "d", np.arange(8000).reshape(1000, 8), shard_records=300)
    done = run("compact", str(tmp_path / "d"))
    assert done.returncode == 0 and "compact d" in done.stderr
    assert run("compact", "-q", str(tmp_path / "d")).stderr == ""
