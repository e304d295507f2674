"""`chute metrics plot` comparing runs, and the EMA / thinning helpers behind the plots."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chute.errors import ChuteError, PlotError
from chute.metrics._cli import main
from chute.metrics._plot import plot_runs
from chute.metrics._smooth import ema, thin

from .dashboard_util import write_run

PNG = b"\x89PNG\r\n\x1a\n"


def reference_ema(values, f):
    acc = weight = 0.0
    out = []
    for v in values:
        if np.isfinite(v):
            acc = f * acc + (1 - f) * v
            weight = f * weight + (1 - f)
        out.append(acc / weight if weight else np.nan)
    return np.array(out), acc, weight


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(float("nan"))), max_size=300),
    st.sampled_from([0.0, 0.3, 0.9, 0.99, 0.999]),
)
def test_ema_matches_the_step_by_step_definition(values, f):
    v = np.array(values, dtype=np.float64)
    out, acc, weight = ema(v, f)
    ref, racc, rweight = reference_ema(v, f)
    assert np.allclose(out, ref, equal_nan=True, rtol=1e-9, atol=1e-6)
    assert acc == pytest.approx(racc, rel=1e-9, abs=1e-6)
    assert weight == pytest.approx(rweight, rel=1e-12, abs=1e-12)


def test_ema_state_continues_over_appended_rows():
    v = np.random.default_rng(0).normal(size=5000)
    whole = ema(v, 0.95)[0]
    _head, acc, weight = ema(v[:3000], 0.95)
    for x in v[3000:3010]:
        acc, weight = 0.95 * acc + 0.05 * x, 0.95 * weight + 0.05
    assert acc / weight == pytest.approx(whole[3009])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        ema(v, 1.0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 200), st.integers(0, 2**32 - 1))
def test_thin_keeps_ends_and_every_bucket_extreme(n, buckets, seed):
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.integers(0, 3, n)).astype(np.float64)  # sorted, with repeats
    y = rng.normal(size=n)
    y[rng.random(n) < 0.05] = np.nan
    keep = thin(x, y, buckets)
    assert np.array_equal(keep, np.unique(keep)) and keep[0] == 0 and keep[-1] == n - 1
    if n <= 4 * buckets:
        assert len(keep) == n
        return
    assert len(keep) <= 4 * buckets
    finite = np.isfinite(y)
    if finite.any():
        assert np.nanmax(y[keep]) == np.nanmax(y) and np.nanmin(y[keep]) == np.nanmin(y)


def test_plot_overlays_runs_named_by_metric_flags(tmp_path):
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, finish=True)
    write_run(b, scale=150, seed=1).close()
    out = tmp_path / "cmp.png"
    assert main(["plot", str(a), str(b), "-m", "loss", "-m", "acc", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    out2 = tmp_path / "cmp2.png"
    assert main(["plot", "loss", "acc", "-r", str(a), "-r", str(b), "-o", str(out2)]) == 0
    assert out2.read_bytes() == out.read_bytes()  # same plot, whichever way it was asked for
    single = tmp_path / "single.png"
    assert main(["plot", str(a), "loss", "-o", str(single)]) == 0
    assert single.read_bytes() != out.read_bytes()


def test_smoothing_is_off_unless_asked(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "r", finish=True)
    run = str(tmp_path / "r")
    paths = {k: tmp_path / f"{k}.png" for k in ("default", "zero", "smooth", "logy")}
    assert main(["plot", run, "lr", "-o", str(paths["default"])]) == 0
    assert main(["plot", run, "lr", "--smooth", "0", "-o", str(paths["zero"])]) == 0
    assert main(["plot", run, "lr", "--smooth", "0.9", "-o", str(paths["smooth"])]) == 0
    assert main(["plot", run, "lr", "--logy", "-o", str(paths["logy"])]) == 0
    data = {k: p.read_bytes() for k, p in paths.items()}
    assert data["default"] == data["zero"]
    assert data["smooth"] != data["default"] and data["logy"] != data["default"]
    assert main(["plot", run, "lr", "--smooth", "1", "-o", str(tmp_path / "x.png")]) == 1


def test_output_is_exactly_the_named_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "r", steps=50, finish=True)
    run = str(tmp_path / "r")
    bare = tmp_path / "plot"
    assert main(["plot", run, "loss", "-o", str(bare)]) == 0
    assert bare.read_bytes()[:8] == PNG
    svg = tmp_path / "plot.svg"
    assert main(["plot", run, "loss", "-o", str(svg)]) == 0
    assert b"<svg" in svg.read_bytes()[:400]
    assert oct(svg.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    before = set(os.listdir(tmp_path))
    assert main(["plot", run, "loss", "-o", str(tmp_path / "plot.nope")]) == 1
    assert "unknown image type 'nope'" in capsys.readouterr().err
    assert set(os.listdir(tmp_path)) == before  # nothing written, no temporary left


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_clear_errors_for_text_missing_and_ambiguous_names(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, steps=30, finish=True)
    write_run(b, steps=30, text=False).close()
    out = str(tmp_path / "o.png")
    assert main(["plot", str(a), "note", "-o", out]) == 1
    assert "'note'" in capsys.readouterr().err and not os.path.exists(out)
    assert main(["plot", str(a), "nope", "-o", out]) == 1
    assert "no run has a metric 'nope'" in capsys.readouterr().err
    assert main(["plot", str(a), "loss", "--x", "nothere", "-o", out]) == 1
    assert "'nothere'" in capsys.readouterr().err
    assert main(["plot", str(a), "-o", out]) == 1
    assert "name a run and its metrics" in capsys.readouterr().err
    assert main(["plot", "loss", "-r", str(a), "-m", "acc", "-o", out]) == 1
    assert "no positional" in capsys.readouterr().err
    # a metric only some runs have: drawn for those, the others named on stderr
    assert main(["plot", str(a), str(b), "-m", "note", "-o", out]) == 1  # text in a
    assert (
        main(["plot", str(b), str(a), "-m", "loss", "-m", "walltime", "--x", "walltime", "-o", out])
        == 0
    )
    assert os.path.exists(out)


def test_missing_metric_in_one_run_is_a_note(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, steps=30, finish=True)
    w = write_run(b, steps=30)
    w.write(extra=1.0)
    w.end_step()
    w.close()
    out = tmp_path / "o.png"
    assert main(["plot", str(a), str(b), "-m", "extra", "-o", str(out)]) == 0
    assert f"run {a} has no metric 'extra'" in capsys.readouterr().err
    assert out.read_bytes()[:8] == PNG


def test_plot_errors_are_chute_errors(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "r", steps=20, finish=True)
    with pytest.raises(PlotError, match="holds text") as info:
        plot_runs([str(tmp_path / "r")], ["note"], str(tmp_path / "o.png"))
    assert isinstance(info.value, ChuteError) and isinstance(info.value, ValueError)
    with pytest.raises(PlotError, match=r"\[0, 1\)"):
        plot_runs([str(tmp_path / "r")], ["loss"], str(tmp_path / "o.png"), smooth=-0.1)


def test_plot_takes_folders_of_runs_and_labels_them_relative_to_it(tmp_path, monkeypatch):
    import chute.metrics._plot as plot_module

    for seed in (1, 2):
        write_run(tmp_path / "sweep" / f"seed{seed}" / "run", steps=20, seed=seed)
    seen = {}
    real = plot_module.plot_runs

    def spy(runs, metrics, output, **kw):
        seen.update(runs=runs, labels=kw["labels"])
        return real(runs, metrics, output, **kw)

    monkeypatch.setattr(plot_module, "plot_runs", spy)
    out = tmp_path / "out.png"
    assert main(["plot", str(tmp_path / "sweep"), "-m", "loss", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(PNG)
    assert seen["labels"] == ["seed1/run", "seed2/run"]  # not absolute paths
    assert main(["plot", str(tmp_path / "nothing"), "-m", "loss", "-o", str(out)]) == 1


def test_log_axes_read_as_plain_numbers(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from chute.metrics._plot import _log_axis

    for low, high in ((1.5, 3.5), (0.01, 1e6)):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [low, high])
        _log_axis(ax)
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_yticklabels(which="both") if t.get_text()]
        plt.close(fig)
        assert labels and not any("10^" in t or "×" in t or "$" in t for t in labels), labels


def test_an_x_axis_that_goes_back_is_refused_not_drawn_as_a_zig_zag(tmp_path):
    from chute.metrics import DirectWriter

    w = DirectWriter(tmp_path / "run")
    for step, wall in enumerate((100.0, 101.0, 5.0, 6.0)):  # a walltime reset on resume
        w.write(loss=1.0 / (step + 1), walltime=wall)
        w.end_step()
    w.finish()
    with pytest.raises(PlotError, match="goes back"):
        plot_runs([str(tmp_path / "run")], ["loss"], str(tmp_path / "o.png"), x="walltime")
    assert main(["plot", str(tmp_path / "run"), "loss", "-o", str(tmp_path / "o.png")]) == 0
