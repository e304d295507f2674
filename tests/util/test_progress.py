"""Progress of long store work: small steps (a bar that moves), in MiB, callbacks that end
at their total."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import chute
from chute import RecordStore
from chute._util import progress as _progress


def test_write_appends_in_small_steps_and_shows_mib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[float] = []
    real = _progress.Progress.advance

    def advance(self: _progress.Progress, nbytes: int) -> None:
        steps.append(nbytes)
        real(self, nbytes)

    monkeypatch.setattr(_progress.Progress, "advance", advance)
    rows = np.random.default_rng(0).integers(0, 3, (3000, 4096)).astype(np.uint8)  # 11.7 MiB
    chute.write_dataset(tmp_path / "a.zr", rows, codec="zstd_dict", progress=True).close()
    assert len(steps) >= 3 and max(steps) <= _progress.STEP_BYTES and sum(steps) == rows.nbytes
    err = capsys.readouterr().err
    assert "11.7/11.7 MiB" in err and "write a.zr" in err
    chute.write_dataset(tmp_path / "b.zr", rows[:10]).close()  # short work: no bar
    assert capsys.readouterr().err == ""


def test_verify_and_compact_report_until_done(tmp_path: Path) -> None:
    with RecordStore(tmp_path / "s.zr", mode="w", codec="raw") as s:
        s.append([bytes([i % 251]) * 300_000 for i in range(200)])  # 57 MiB
        seen: list[tuple[int, int]] = []
        report = s.verify(progress=lambda done, total: seen.append((done, total)))
        assert report["checked"] == 200 and len(seen) >= 3
        assert seen[-1] == (200 * 300_000, 200 * 300_000)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
        s.delete(range(0, 200, 2))
        seen.clear()
        s.compact(progress=lambda done, total: seen.append((done, total)))
        assert len(seen) >= 2 and seen[-1][0] == seen[-1][1] > 0


def test_level_must_be_a_zstd_level(tmp_path: Path) -> None:
    for level in (23, -(1 << 20), 2.5, True):
        with pytest.raises(ValueError, match="zstd level"):
            RecordStore(tmp_path / "s.zr", mode="w", level=level)  # type: ignore[arg-type]
    assert not (tmp_path / "s.zr").exists()
    with RecordStore(tmp_path / "s.zr", mode="w", level=-5) as s:  # zstd's fast levels are fine
        s.append([b"abc" * 100])
        assert s.gather_packed([0])[0].tobytes() == b"abc" * 100


def test_ragged_write_shows_a_bar_once_the_work_is_large(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_progress, "SHOW_OVER_BYTES", 1 << 20)
    seqs = [np.full((1000 + i, 64), i, np.uint8) for i in range(40)]  # 2.6 MiB
    chute.write_ragged(tmp_path / "r.zr", seqs[:5]).close()  # under the threshold: quiet
    assert capsys.readouterr().err == ""
    ds = chute.write_ragged(tmp_path / "s.zr", iter(seqs), codec="zstd_dict")
    err = capsys.readouterr().err
    assert "write s.zr" in err and "MiB" in err
    assert len(ds) == 40 and np.array_equal(ds[39], seqs[39])
    chute.write_ragged(tmp_path / "t.zr", seqs, progress=False).close()
    assert capsys.readouterr().err == ""
