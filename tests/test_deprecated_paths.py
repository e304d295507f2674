"""Module paths that moved keep working for one release, with a DeprecationWarning naming
the new home; what they hand out is the very same object."""

from __future__ import annotations

import importlib
import sys

import pytest

import chute


@pytest.mark.parametrize(
    ("old", "names"),
    [
        ("chute.dataset", ["Dataset", "write_dataset"]),
        ("chute.ragged", ["RaggedDataset", "write_ragged", "pad"]),
        ("chute.sampler", ["Sampler", "StepSampler", "WeightedSampler", "SamplerLike"]),
    ],
)
def test_a_moved_module_warns_and_hands_out_the_same_objects(old: str, names: list[str]) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        module = importlib.import_module(old)
    for name in names:
        assert getattr(module, name) is getattr(chute, name)
