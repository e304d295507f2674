"""Deprecated path: the samplers live in `chute` (and `chute.loader`).

Kept for one release so ``from chute.sampler import Sampler`` still runs, with a
DeprecationWarning; import from ``chute`` or ``chute.loader`` instead.
"""

import warnings

from chute.loader import Sampler, SamplerLike, SamplerMode, StepSampler, WeightedSampler

__all__ = ["Sampler", "SamplerLike", "SamplerMode", "StepSampler", "WeightedSampler"]

warnings.warn(
    "chute.sampler is deprecated; import the samplers from chute or chute.loader",
    DeprecationWarning,
    stacklevel=2,
)
