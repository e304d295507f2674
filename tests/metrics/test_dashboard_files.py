"""What the dashboard opens: files inside each served run only, regular ones, read with a bound.

Links planted inside a served run must not serve what lies outside it, and a FIFO or an
endless device must not hang or exhaust the server (those checks run in a child process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("starlette")

import chute.metrics as cm

from ..store.isolate import OK, WRONG_DATA, run_isolated
from .dashboard_util import client, runs_by_name, write_run

SECRET = "hunter2-not-to-be-served"
OUTSIDE_METRIC = "only_outside_the_served_folder"


@pytest.fixture
def served(tmp_path):
    """A served folder with one good run, and an outside folder of things not to serve."""
    root, out = tmp_path / "served", tmp_path / "outside"
    write_run(root / "good", steps=10).close()
    out.mkdir()
    (out / "secret.json").write_text(json.dumps({"token": SECRET}))
    (out / "secret.txt").write_text(f"root:x:0:0:{SECRET}\n")
    with cm.DirectWriter(out / "run") as w:  # a metric only outside, rows at odd steps
        for s in range(5000):
            w.write(loss=1.0, **({OUTSIDE_METRIC: 7.0} if s % 2 else {}))
            w.end_step()
    with cm.DirectWriter(out / "done") as w:
        w.write(**{OUTSIDE_METRIC: 1.0})
        w.end_step()
        w.finish()
    return root, out


def _everything(c):
    """The text of every answer the API gives about every run."""
    texts = [c.get("/api/runs").text]
    for run in c.get("/api/runs").json()["runs"]:
        base = f"/api/runs/{run['id']}"
        texts += [c.get(base + "/config").text, c.get(base + "/metrics").text]
        texts.append(c.get(base + "/series", params={"metric": "loss"}).text)
    return "\n".join(texts)


def test_a_config_linked_out_of_its_run_is_not_served(served):
    root, out = served
    cfg = root / "good" / "plattli" / "config.json"
    cfg.unlink()
    cfg.symlink_to(out / "secret.json")
    with client(root) as c:
        good = runs_by_name(c)["good"]
        answer = c.get(f"/api/runs/{good['id']}/config").json()
        assert "UnsafeFileError" in answer["error"] and "outside" in answer["error"]
        assert good["last_step"] == 9  # the run itself still lists
        assert SECRET not in _everything(c)


def test_a_config_linked_inside_its_run_is_served(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text('{"lr": 0.5}')
    with cm.DirectWriter(tmp_path / "r", config="config.json") as w:
        w.write(loss=1.0)
        w.end_step()
    with client(tmp_path) as c:
        (run,) = runs_by_name(c).values()
        assert c.get(f"/api/runs/{run['id']}/config").json() == {"lr": 0.5}


def test_a_hot_log_linked_out_shows_none_of_its_bytes(served):
    root, out = served
    (root / "good" / "plattli" / "hot.jsonl").symlink_to(out / "secret.txt")
    with client(root) as c:
        good = runs_by_name(c)["good"]
        assert good["status"] == "error" and "outside" in good["error"]
        assert SECRET not in _everything(c)


def test_a_linked_plattli_folder_or_archive_serves_no_outside_run(served):
    root, out = served
    (root / "dir").mkdir()
    (root / "dir" / "plattli").symlink_to(out / "run" / "plattli")
    (root / "zip").mkdir()
    (root / "zip" / "metrics.plattli").symlink_to(out / "done" / "metrics.plattli")
    with client(root) as c:
        runs = runs_by_name(c)
        assert "zip" not in runs  # a folder whose only run file leads out is no run
        assert runs["dir"]["status"] == "error" and "outside" in runs["dir"]["error"]
        assert OUTSIDE_METRIC not in _everything(c)


def test_an_index_file_linked_out_is_not_read_by_the_run_list(served):
    root, out = served
    w = cm.DirectWriter(root / "sparse")
    for s in range(4):
        if s != 1:  # a gap: the column keeps an explicit sparse.indices
            w.write(loss=0.5)
        w.end_step()
    w.close()
    pdir = root / "sparse" / "plattli"
    (pdir / "loss.indices").unlink()
    (pdir / "loss.indices").symlink_to(out / "run" / "plattli" / f"{OUTSIDE_METRIC}.indices")
    with client(root) as c:
        sparse = runs_by_name(c)["sparse"]  # the old list said last step 4999, from outside
        assert sparse["status"] == "error" and "outside" in sparse["error"]
        assert "last_step" not in sparse


def _cap_address_space(room: int = 2 << 30) -> None:
    """Limit this (child) process to ``room`` bytes of address space beyond what it maps now.

    A fixed cap fails whenever the suite has already mapped more (jax, torch, Ray, Arrow
    and their thread stacks): the child's threads then cannot start and the check hangs.
    """
    import resource

    status = Path("/proc/self/status").read_text()
    vm_size = next(line for line in status.splitlines() if line.startswith("VmSize:"))
    mapped_kib = int(vm_size.split()[1])
    cap = mapped_kib * 1024 + room
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _serve_in_child(root, check):
    """Child: run `check(client)` over a dashboard of `root`; OK when it holds."""

    def child() -> int:
        with client(root) as c:
            return OK if check(c) else WRONG_DATA

    return run_isolated(child, timeout=60)


def test_a_fifo_hot_log_does_not_hang_the_run_list(served):
    root, _out = served
    os.mkfifo(root / "good" / "plattli" / "hot.jsonl")
    write_run(root / "other", steps=3).close()

    def check(c):
        runs = runs_by_name(c)
        return "FIFO" in runs["good"]["error"] and runs["other"]["last_step"] == 2

    assert _serve_in_child(root, check) == OK


def test_a_fifo_config_neither_hangs_its_page_nor_the_run_list(served):
    root, _out = served
    cfg = root / "good" / "plattli" / "config.json"
    cfg.unlink()
    os.mkfifo(cfg)

    def check(c):
        good = runs_by_name(c)["good"]
        answer = c.get(f"/api/runs/{good['id']}/config").json()
        return "FIFO" in answer["error"] and runs_by_name(c)["good"]["last_step"] == 9

    assert _serve_in_child(root, check) == OK


def test_files_linked_to_dev_zero_are_refused_not_read(served):
    root, _out = served
    pdir = root / "good" / "plattli"
    (pdir / "config.json").unlink()
    (pdir / "config.json").symlink_to("/dev/zero")
    write_run(root / "hot", steps=3).close()
    (root / "hot" / "plattli" / "hot.jsonl").symlink_to("/dev/zero")

    def check(c):
        _cap_address_space()  # reading /dev/zero never ends: let it fail, not fill the machine
        runs = runs_by_name(c)
        answer = c.get(f"/api/runs/{runs['good']['id']}/config").json()
        return "UnsafeFileError" in answer["error"] and "UnsafeFileError" in runs["hot"]["error"]

    assert _serve_in_child(root, check) == OK
