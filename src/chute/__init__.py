"""chute: the disk side of a training run."""

from chute.loader import DataLoader
from chute.sampler import Sampler

__all__ = ["DataLoader", "Sampler"]
