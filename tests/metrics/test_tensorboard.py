"""Meeting TensorBoard users: torch's SummaryWriter calls write a chute run, and event files
written by torch convert into one."""

from __future__ import annotations

import numpy as np
import pytest

import chute.metrics as cm
from chute.errors import StepOrderError
from chute.metrics._cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")


def _log(writer) -> None:
    """A torch logging snippet, as a user has it: only the import differs."""
    for step in range(5):
        writer.add_scalar("loss/train", 1.0 / (step + 1), step)
        writer.add_scalar("lr", torch.tensor(0.1 * 0.9**step), step)
        writer.add_scalars("acc", {"top1": 0.1 * step, "top5": 0.2 * step}, step)
        if step % 2 == 0:
            writer.add_text("note", f"step {step} done", step)
    writer.add_hparams({"lr": 0.1, "depth": 3, "opt": "adam"}, {"hp/final": 0.25})
    writer.flush()
    writer.close()


def test_summary_writer_runs_a_torch_snippet_unchanged_but_for_the_import(tmp_path):
    _log(cm.SummaryWriter(tmp_path / "run"))
    with cm.Reader(tmp_path / "run") as r:
        assert r.metric("loss/train")[0].tolist() == [0, 1, 2, 3, 4]
        assert np.allclose(r.metric("lr")[1], 0.1 * 0.9 ** np.arange(5), rtol=1e-6)
        assert r.metric("acc/top5")[1].tolist()[-1] == pytest.approx(0.8)
        assert r.metric("note")[1].tolist() == ["step 0 done", "step 2 done", "step 4 done"]
        assert r.config() == {"lr": 0.1, "depth": 3, "opt": "adam"}
        assert r.metric("hp/final")[0].tolist() == [4]  # at the current step, the last
        assert r.rows(cm.CLOCK_WALL) == 5


def test_summary_writer_steps(tmp_path):
    w = cm.SummaryWriter(tmp_path / "run", clock=False)
    w.add_scalar("a", 1.0, 0)
    w.add_scalar("a", 2.0, 10)  # a jump ends step 0
    with pytest.raises(StepOrderError, match="purge_step=5"):
        w.add_scalar("a", 3.0, 5)
    w.add_scalar("b", 4.0)  # no step: the current one
    w.close()
    again = cm.SummaryWriter(tmp_path / "run", clock=False)  # continues after step 10
    again.add_scalar("a", 5.0)
    again.close()
    with cm.Reader(tmp_path / "run") as r:
        assert r.metric("a")[0].tolist() == [0, 10, 11] and r.metric("b")[0].tolist() == [10]
    purged = cm.SummaryWriter(tmp_path / "run", purge_step=10, clock=False)
    purged.add_scalar("a", 6.0, 10)
    purged.close()
    with cm.Reader(tmp_path / "run") as r:
        assert r.metric("a")[1].tolist() == [1.0, 6.0]
    with pytest.raises(NotImplementedError, match="add_image"):
        cm.SummaryWriter(tmp_path / "other").add_image("x", np.zeros((3, 2, 2)))
    with pytest.raises(AttributeError):
        cm.SummaryWriter(tmp_path / "third").no_such_method  # noqa: B018


def test_event_files_written_by_torch_convert_and_read_back(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "events"))
    _log(writer)
    writer = SummaryWriter(str(tmp_path / "events"))  # a second writer, as a resumed job
    writer.add_scalar("loss/train", 0.1, 5)
    writer.add_histogram("weights", np.arange(10.0), 5)  # a kind a metric run does not hold
    writer.close()
    assert main(["from-tensorboard", str(tmp_path / "events"), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "values of other kinds left out" in out
    with cm.Reader(tmp_path / "run") as r:
        assert r.metric("loss/train")[0].tolist() == [0, 1, 2, 3, 4, 5]
        assert r.metric("loss/train")[1][-1] == pytest.approx(0.1)
        assert r.metric("acc/top1")[1].tolist()[2] == pytest.approx(0.2)
        assert r.metric("note")[1].tolist() == ["step 0 done", "step 2 done", "step 4 done"]
        assert r.config() == {"lr": 0.1, "depth": 3.0, "opt": "adam"}
        assert r.metric("hp/final")[1].tolist() == [0.25]
        steps, walls = r.metric(cm.CLOCK_WALL)
        assert steps.tolist() == [0, 1, 2, 3, 4, 5] and (walls > 1.7e9).all() and r.finished
    assert main(["from-tensorboard", str(tmp_path / "events"), str(tmp_path / "run")]) == 1
    assert main(["from-tensorboard", str(tmp_path / "events"), str(tmp_path / "run"),
                 "--overwrite"]) == 0  # fmt: skip
    assert main(["from-tensorboard", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 1
