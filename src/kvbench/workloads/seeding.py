"""One way to turn a seed into a numpy random generator, so equal seeds give equal workloads."""

from __future__ import annotations

import numpy as np

SeedLike = int | np.random.Generator


def as_generator(seed: SeedLike) -> np.random.Generator:
    """``seed`` itself when it is a Generator, else a fresh PCG64 generator seeded with it."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def stream(seed: int, purpose: int) -> np.random.Generator:
    """An independent generator per purpose (sampling, arrivals, ...) derived from one seed,
    so that changing how many rows are sampled never shifts the arrival times."""
    return np.random.default_rng([seed, purpose])
