"""The one rule for files chute is pointed at: regular, inside the folder, read with a bound."""

import os
import threading
from pathlib import Path

import pytest

from chute._util.safe_open import Folder, inside, open_regular, read_regular
from chute.errors import ChuteError, UnsafeFileError


def test_a_regular_file_inside_reads_whole(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_bytes(b"x" * 10)
    assert read_regular(tmp_path / "sub" / "a", tmp_path, limit=10) == b"x" * 10


def test_a_symlink_that_stays_inside_is_followed(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert read_regular(tmp_path / "b", tmp_path, limit=3) == b"abc"


@pytest.mark.parametrize("target", ["/etc/hostname", "../outside"])
def test_a_path_that_resolves_outside_is_refused(tmp_path: Path, target: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").write_text("secret")
    (root / "link").symlink_to(target)
    with pytest.raises(UnsafeFileError, match="outside"):
        read_regular(root / "link", root, limit=100)
    with pytest.raises(UnsafeFileError):
        inside(root / ".." / "outside", root)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    result: list[BaseException] = []

    def attempt() -> None:
        try:
            read_regular(tmp_path / "pipe", tmp_path, limit=100)
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "opening a FIFO blocked"
    assert isinstance(result[0], UnsafeFileError) and "FIFO" in str(result[0])


def test_devices_and_folders_are_refused(tmp_path: Path) -> None:
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnsafeFileError):  # outside, and a device
        read_regular(tmp_path / "zero", tmp_path, limit=100)
    with pytest.raises(UnsafeFileError, match="character device"):
        read_regular("/dev/zero", "/dev", limit=100)
    (tmp_path / "d").mkdir()
    with pytest.raises(UnsafeFileError, match="folder"):
        open_regular(tmp_path / "d", tmp_path)


def test_a_file_over_the_bound_is_refused_after_reading_no_more(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"y" * (3 << 20))
    with pytest.raises(UnsafeFileError, match="more than the 1000 bytes"):
        read_regular(tmp_path / "big", tmp_path, limit=1000)


def test_a_missing_file_stays_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "nope", tmp_path, limit=10)


def test_unsafe_file_error_is_a_chute_error_and_an_os_error() -> None:
    assert issubclass(UnsafeFileError, ChuteError) and issubclass(UnsafeFileError, OSError)


def test_a_folder_link_out_above_the_file_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m0.f32").write_bytes(b"secret")
    run = tmp_path / "run"
    run.mkdir()
    (run / "plattli").symlink_to(outside)  # the file itself is no link: its folder leads out
    folder = Folder(run)
    with pytest.raises(UnsafeFileError, match="outside"):
        folder.open(run / "plattli" / "m0.f32")
    with pytest.raises(UnsafeFileError, match="outside"):
        read_regular(run / "plattli" / "m0.f32", run, limit=100)


def test_a_folder_re_pointed_after_it_was_resolved_is_looked_up_again(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.json").write_bytes(name.encode())
    (tmp_path / "latest").symlink_to(tmp_path / "a")
    folder = Folder(tmp_path / "latest")
    assert folder.read(tmp_path / "latest" / "x.json", 10) == b"a"
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").symlink_to(tmp_path / "b")
    assert folder.read(tmp_path / "latest" / "x.json", 10) == b"b"
