"""chute: the disk side of a training run."""

from chute.sampler import Sampler

__all__ = ["Sampler"]
