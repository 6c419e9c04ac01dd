"""Fit the profiled cost model's coefficients to measured times.

Least squares on relative error (each point weighted by 1 / its time, so a 5 ms decode step
counts as much as a 2 s prefill), under non-negative coefficients, solved exactly (Lawson and
Hanson's active set, ``scipy.optimize.nnls``). A term at 0 is a cost that did not show on this
device. (Dropping whichever term comes out most negative and refitting, as this module once did,
can stop at a set of terms that is not the optimum's.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls


def fit_non_negative(
    features: Sequence[Sequence[float]], times_s: Sequence[float]
) -> np.ndarray:
    """Coefficients >= 0 (one per feature column) minimising sum(((X c - t) / t)^2)."""
    matrix = np.asarray(features, dtype=np.float64)  # [num_points, num_terms]
    targets = np.asarray(times_s, dtype=np.float64)  # [num_points]
    if matrix.ndim != 2 or matrix.shape[0] != targets.shape[0]:
        raise ValueError(f"features {matrix.shape} and times {targets.shape} do not match")
    weights = 1.0 / targets  # [num_points]
    weighted = matrix * weights[:, None]  # [num_points, num_terms]
    # Scale columns to unit norm so the solve is well conditioned (pairs reach 1e5, 1 is 1).
    norms = np.linalg.norm(weighted, axis=0)  # [num_terms]
    active = norms > 0  # a term no point has prices nothing: 0
    coefficients = np.zeros(matrix.shape[1])  # [num_terms]
    if active.any():
        scaled, _ = nnls(weighted[:, active] / norms[active], targets * weights)
        coefficients[active] = scaled / norms[active]
    return coefficients


def abs_pct_errors(predicted_s: Sequence[float], measured_s: Sequence[float]) -> np.ndarray:
    """|predicted - measured| / measured x 100, per point."""
    predicted = np.asarray(predicted_s, dtype=np.float64)
    measured = np.asarray(measured_s, dtype=np.float64)
    return np.abs(predicted - measured) / measured * 100
