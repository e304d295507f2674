"""The step loader: samplers (a batch's positions as a pure function of seed and step), endless
batches keyed by step, finite evaluation passes, subsets."""

from chute.loader._evaluate import EvalPass, Last, iterate
from chute.loader._loader import DataLoader
from chute.loader._mix import MixSampler, Mixture, mix
from chute.loader._sampler import Sampler, SamplerLike, SamplerMode, StepSampler, WeightedSampler
from chute.loader._streams import Batch, Stream
from chute.loader._subset import split
from chute.loader._tokens import PackedTokens, TokenWindows, varlen
from chute.loader._window import ShardWindowSampler

__all__ = [
    "Batch",
    "DataLoader",
    "EvalPass",
    "Last",
    "MixSampler",
    "Mixture",
    "PackedTokens",
    "Sampler",
    "SamplerLike",
    "SamplerMode",
    "ShardWindowSampler",
    "StepSampler",
    "Stream",
    "TokenWindows",
    "WeightedSampler",
    "iterate",
    "mix",
    "split",
    "varlen",
]
