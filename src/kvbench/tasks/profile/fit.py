"""Fit the profiled cost model's coefficients to measured times.

Least squares on relative error (each point weighted by 1 / its time, so a 5 ms decode step
counts as much as a 2 s prefill), under non-negative coefficients but for the signed ones,
solved exactly (Lawson and Hanson's active set, ``scipy.optimize.nnls``; with signed terms its
bounded form, ``lsq_linear``'s ``bvls``). A non-negative term at 0 is a cost that did not show on
this device. (Dropping whichever term comes out most negative and refitting, as this module once
did, can stop at a set of terms that is not the optimum's.)

A signed term whose column equals another's over the points (a stair whose band of token counts
no point computes: the same as the next stair there) is not fitted (0): the points cannot tell
the two apart, and any split between them would price the unmeasured band by chance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import lsq_linear, nnls


def fit_relative(
    features: Sequence[Sequence[float]], times_s: Sequence[float],
    signed: Sequence[bool] | None = None,
) -> np.ndarray:
    """Coefficients (one per feature column) minimising sum(((X c - t) / t)^2), each >= 0 but
    those ``signed`` marks (the module docstring)."""
    matrix = np.asarray(features, dtype=np.float64)  # [num_points, num_terms]
    targets = np.asarray(times_s, dtype=np.float64)  # [num_points]
    if matrix.ndim != 2 or matrix.shape[0] != targets.shape[0]:
        raise ValueError(f"features {matrix.shape} and times {targets.shape} do not match")
    is_signed = np.zeros(matrix.shape[1], dtype=bool) if signed is None else np.asarray(signed)
    if is_signed.shape != (matrix.shape[1],):
        raise ValueError(f"{is_signed.shape[0]} signed flags for {matrix.shape[1]} terms")
    weights = 1.0 / targets  # [num_points]
    weighted = matrix * weights[:, None]  # [num_points, num_terms]
    # Scale columns to unit norm so the solve is well conditioned (pairs reach 1e5, 1 is 1).
    norms = np.linalg.norm(weighted, axis=0)  # [num_terms]
    active = (norms > 0) & ~_signed_duplicates(matrix, is_signed)  # others price nothing: 0
    coefficients = np.zeros(matrix.shape[1])  # [num_terms]
    if not active.any():
        return coefficients
    scaled_matrix = weighted[:, active] / norms[active]  # [num_points, num_active]
    if is_signed[active].any():
        lower = np.where(is_signed[active], -np.inf, 0.0)  # [num_active]
        scaled = lsq_linear(scaled_matrix, targets * weights, bounds=(lower, np.inf),
                            method="bvls").x  # fmt: skip
        # bvls can leave a term held at its bound a rounding error below it (-5e-17).
        scaled = np.maximum(scaled, lower)
    else:
        scaled, _ = nnls(scaled_matrix, targets * weights)
    coefficients[active] = scaled / norms[active]
    return coefficients


def _signed_duplicates(matrix: np.ndarray, is_signed: np.ndarray) -> np.ndarray:
    """Per column: whether it is signed and equals, over the points, a column fitted in its
    place (a later one, or a non-signed one)."""
    num_terms = matrix.shape[1]
    duplicates = np.zeros(num_terms, dtype=bool)  # [num_terms]
    for term in np.flatnonzero(is_signed):
        others = [other for other in range(num_terms)
                  if other != term and (other > term or not is_signed[other])]  # fmt: skip
        duplicates[term] = any(np.array_equal(matrix[:, term], matrix[:, other])
                               for other in others)  # fmt: skip
    return duplicates


def abs_pct_errors(predicted_s: Sequence[float], measured_s: Sequence[float]) -> np.ndarray:
    """|predicted - measured| / measured x 100, per point."""
    predicted = np.asarray(predicted_s, dtype=np.float64)
    measured = np.asarray(measured_s, dtype=np.float64)
    return np.abs(predicted - measured) / measured * 100
