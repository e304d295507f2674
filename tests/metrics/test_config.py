"""A run's config.json that is not a JSON object is damage: a CorruptRunError naming the file."""

from __future__ import annotations

import pytest

import chute.metrics as cm
from chute.errors import ChuteError, CorruptRunError


def _run(path):
    w = cm.DirectWriter(path)
    w.set_config({"lr": 0.1})
    w.write(loss=1.0)
    w.end_step()
    return w


@pytest.mark.parametrize("text", ['{"lr": 0.1', "[1, 2]", "\xff", "[" * 100_000])
def test_a_corrupt_config_is_a_corrupt_run_error_naming_it(tmp_path, text):
    _run(tmp_path).close()
    cfg = tmp_path / "plattli" / "config.json"
    cfg.write_bytes(text.encode("latin-1"))
    with cm.Reader(tmp_path) as r, pytest.raises(CorruptRunError) as e:
        r.config()
    assert isinstance(e.value, ChuteError) and isinstance(e.value, ValueError)
    assert e.value.path == str(cfg) and str(cfg) in str(e.value)


def test_finishing_over_a_corrupt_config_names_it(tmp_path):
    w = _run(tmp_path)
    cfg = tmp_path / "plattli" / "config.json"
    cfg.write_text("{not json")
    with pytest.raises(CorruptRunError, match=r"config\.json is not valid JSON"):
        w.finish(config_overrides={"done": True})
    w.close()
