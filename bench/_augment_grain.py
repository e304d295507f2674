"""Grain's random maps for bench/transforms.py (a module of their own: chute's and torch's
workers need not import Grain)."""

from __future__ import annotations

import grain.python as pg
import numpy as np
from _augment import image


class GrainPlain(pg.RandomMapTransform):
    def random_map(self, element: bytes, rng: np.random.Generator) -> np.ndarray:
        return image(element, rng, False)


class GrainPython(pg.RandomMapTransform):
    def random_map(self, element: bytes, rng: np.random.Generator) -> np.ndarray:
        return image(element, rng, True)
