"""`chute metrics` subcommands through `main(argv)` and `python -m chute.metrics`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import plattli
import pytest

import chute.metrics as cm
from chute.metrics._cli import main

from ._util import assert_readers_agree


def _write_jsonl(run, rows, config=None):
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    if config is not None:
        (run / "config.json").write_text(json.dumps(config))


def _rows(n=50):
    out = []
    for s in range(n):
        row = {
            "step": s * 2,
            "loss": 1.0 / (s + 1),
            "tokens": s * 512,
            "note": f"n{s}",
            "gnorm/layer0": 0.1,
            "ok": s % 2 == 0,
        }
        if s % 5 == 0:
            row["eval/acc"] = s / 100
            row["nested"] = {"s": s, "v": [1, None]}
        out.append(row)
    return out


def test_from_jsonl_in_place_and_outdir_match_plattli(tmp_path, capsys):
    _write_jsonl(tmp_path / "exp" / "a", _rows(), config={"lr": 0.1})
    _write_jsonl(tmp_path / "exp" / "b" / "deep", _rows(7))
    assert main(["from-jsonl", str(tmp_path / "exp"), "--skipcols", "DEFAULT"]) == 0
    assert "converted" in capsys.readouterr().out
    run = tmp_path / "exp" / "a"
    assert (run / "metrics.plattli").exists()
    assert not (tmp_path / "exp" / "b" / "deep" / "metrics.plattli").exists()  # not --deep
    with cm.Reader(run) as r:
        assert "gnorm/layer0" not in r.metrics()
        assert r.config() == {"lr": 0.1}
        assert r.metric("eval/acc")[0].tolist() == list(range(0, 100, 10))
    assert_readers_agree(run)

    out = tmp_path / "out"
    ref = tmp_path / "ref"
    assert main(["from-jsonl", str(tmp_path / "exp"), "--deep", "-o", str(out), "-w", "2"]) == 0
    subprocess.run(
        [
            sys.executable,
            "-m",
            "plattli.jsonl2plattli",
            str(tmp_path / "exp"),
            "--deep",
            "-o",
            str(ref),
        ],
        check=True,
        capture_output=True,
    )
    for rel in ("exp/a.plattli", "exp/b/deep.plattli"):
        assert_readers_agree(out / rel)
        with cm.Reader(out / rel) as ours, plattli.Reader(ref / rel) as theirs:
            # JSON fractions are doubles: chute keeps them as f64 where jsonl2plattli rounds
            # to f32 (docs/coming-from-plattli.md); everything else is the same.
            theirs_m = {
                k: {**e, "dtype": "f64" if e["dtype"] == "f32" else e["dtype"]}
                for k, e in theirs.manifest().items()
            }
            assert ours.manifest() == theirs_m
            for name in theirs.metrics():
                a, b = ours.metric(name), theirs.metric(name)
                assert a[0].tolist() == b[0].tolist()
                va = a[1].astype(b[1].dtype) if b[1].dtype == np.float32 else a[1]
                assert va.tolist() == b[1].tolist()


def test_from_jsonl_rewinds_and_errors(tmp_path, capsys):
    rows = [{"step": 0, "a": 1}, {"step": 1, "a": 2}, {"step": 2, "a": 3}, {"step": 1, "a": 20}]
    _write_jsonl(tmp_path / "e" / "r", rows)
    assert main(["from-jsonl", str(tmp_path / "e")]) == 1
    assert "--allow-rewinds" in capsys.readouterr().err
    assert not (tmp_path / "e" / "r" / "metrics.plattli").exists()
    assert main(["from-jsonl", str(tmp_path / "e"), "--allow-rewinds"]) == 0
    with cm.Reader(tmp_path / "e" / "r") as r:
        assert r.metric("a")[1].tolist() == [1, 20]
    # A torn last line (log still being written) is skipped; steps default to row order.
    with open(tmp_path / "e" / "r" / "metrics.jsonl", "w") as f:
        f.write('{"a": 1.5}\n{"a": NaN}\n{"a": 2')
    assert main(["from-jsonl", str(tmp_path / "e")]) == 0
    with cm.Reader(tmp_path / "e" / "r") as r:
        steps, vals = r.metric("a")
        assert steps.tolist() == [0, 1] and vals[0] == 1.5 and np.isnan(vals[1])
    assert main(["from-jsonl", str(tmp_path / "nothing-here-")]) == 1


def test_ls_and_tail(tmp_path, capsys):
    w = cm.CompactingWriter(tmp_path, hotsize=4)
    for s in range(12):
        w.write(loss=1.0 / (s + 1), note=f"n{s}")
        w.end_step()
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["metric", "rows", "dtype", "last", "step", "last", "value"]
    assert out[1].split() == ["loss", "12", "f64", "11", "0.0833333"]
    assert out[2].split() == ["note", "12", "jsonl", "11", "n11"]
    assert main(["tail", str(tmp_path), "-n", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "10: loss=0.0909091 note=n10",
        "11: loss=0.0833333 note=n11",
    ]

    def more():
        time.sleep(0.3)
        for s in range(12, 15):
            w.write(loss=float(s), note=f"n{s}")
            w.end_step()
        w.close()

    t = threading.Thread(target=more)
    t.start()
    assert (
        main(["tail", str(tmp_path), "-n", "0", "-f", "--interval", "0.1", "--idle-exit", "1.0"])
        == 0
    )
    t.join()
    assert capsys.readouterr().out.splitlines() == [
        "12: loss=12 note=n12",
        "13: loss=13 note=n13",
        "14: loss=14 note=n14",
    ]
    assert main(["ls", str(tmp_path / "missing")]) == 1


def test_python_m_entry_point(tmp_path):
    w = cm.DirectWriter(tmp_path)
    w.write(a=1)
    w.end_step()
    w.finish()
    res = subprocess.run(
        [sys.executable, "-m", "chute.metrics", "ls", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.splitlines()[1].split() == ["a", "1", "u8", "0", "1"]


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    w = cm.DirectWriter(tmp_path / "run")
    rng = np.random.default_rng(0)
    for s in range(300):
        w.write(loss=float(np.exp(-s / 80) + rng.normal(0, 0.05)), walltime=1000.0 + 0.5 * s)
        if s % 10 == 0:
            w.write(acc=float(1 - np.exp(-s / 100)))
        w.end_step()
    w.finish()
    out = tmp_path / "plot.png"
    assert main(["plot", str(tmp_path / "run"), "loss", "acc", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    out2 = tmp_path / "wall.png"
    assert main(["plot", str(tmp_path / "run"), "loss", "-o", str(out2), "--x", "walltime"]) == 0
    assert out2.stat().st_size > 10_000
    assert main(["plot", str(tmp_path / "run"), "nope", "-o", str(tmp_path / "x.png")]) == 1


def test_top_level_chute_command_delegates(tmp_path):
    w = cm.DirectWriter(tmp_path)
    w.write(a=2.5)
    w.end_step()
    w.close()
    exe = os.path.join(os.path.dirname(sys.executable), "chute")
    res = subprocess.run(
        [exe, "metrics", "ls", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert res.stdout.splitlines()[1].split() == ["a", "1", "f64", "0", "2.5"]


def test_tail_takes_a_folder_of_runs(tmp_path, capsys):
    for name, value in (("a", 1.0), ("b", 2.0)):
        w = cm.DirectWriter(tmp_path / "runs" / name)
        for _ in range(3):
            w.write(x=value)
            w.end_step()
        w.finish()
    assert main(["tail", str(tmp_path / "runs"), "-n", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a: 2: x=1", "b: 2: x=2"]
    assert main(["tail", str(tmp_path / "runs"), "-n", "1", "-f", "--interval", "0.01"]) == 0
    capsys.readouterr()  # finished runs: follow mode ends at once
    assert main(["tail", str(tmp_path / "runs" / "a"), "-n", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["2: x=1"]  # one run: no prefix
    assert main(["tail", str(tmp_path / "none")]) == 1


@pytest.mark.parametrize("cmd", [["ls"], ["tail", "-n", "2"], ["verify"]])
def test_a_damaged_archive_is_named_not_skipped(tmp_path, capsys, cmd):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.plattli").write_bytes(b"PK\x03\x04garbage")
    assert main([cmd[0], str(run), *cmd[1:]]) == 1
    err = capsys.readouterr().err
    assert str(run / "metrics.plattli") in err and "no runs" not in err
    lone = tmp_path / "lone.plattli"
    lone.write_bytes(b"not a zip")
    assert main([cmd[0], str(lone), *cmd[1:]]) == 1
    assert str(lone) in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["ls", "tail"])
def test_a_folder_of_runs_reports_its_damaged_ones(tmp_path, capsys, cmd):
    runs = tmp_path / "runs"
    w = cm.DirectWriter(runs / "good")
    w.write(x=1.0)
    w.end_step()
    w.finish()
    (runs / "bad").mkdir()
    (runs / "bad" / "metrics.plattli").write_bytes(b"PK\x03\x04garbage")
    (runs / "stray.plattli").write_bytes(b"not a zip")
    assert main([cmd, str(runs)]) == 1
    out, err = capsys.readouterr()
    for damaged in ("bad/metrics.plattli", "stray.plattli"):
        assert str(runs / damaged) in err
    if cmd == "ls":
        table = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
        assert table == {"bad": "damaged", "good": "finished", "stray.plattli": "damaged"}
    else:
        assert out.splitlines() == ["good: 0: x=1"]
