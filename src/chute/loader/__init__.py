"""The step loader: endless batches keyed by step, finite evaluation passes, subsets."""

from chute.loader._evaluate import EvalPass, Last, iterate
from chute.loader._loader import DataLoader
from chute.loader._streams import Batch, Stream
from chute.loader._subset import split

__all__ = ["Batch", "DataLoader", "EvalPass", "Last", "Stream", "iterate", "split"]
