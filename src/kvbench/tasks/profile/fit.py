"""Fit the profiled cost model's coefficients to measured times.

Least squares on relative error (each point weighted by 1 / its time, so a 5 ms decode step
counts as much as a 2 s prefill), under non-negative coefficients but for the signed ones,
solved exactly (Lawson and Hanson's active set, ``scipy.optimize.nnls``; a signed term is the
difference of two non-negative ones, its column and its negation). A non-negative term at 0 is a
cost that did not show on this device. (Dropping whichever term comes out most negative and
refitting, as this module once did, can stop at a set of terms that is not the optimum's; scipy's
bounded solver, ``lsq_linear``'s ``bvls``, stopped short of the optimum on vLLM's grid steps.)

A signed term whose column equals another's over the points (a stair whose band of token counts
no point computes: the same as the next stair there) is not fitted (0): the points cannot tell
the two apart, and any split between them would price the unmeasured band by chance. Where the
other is a non-signed term, that term keeps the level, and the level stays >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from kvbench.engine.profiled import signed_terms


def fit_terms(
    features: Sequence[Sequence[float]], times_s: Sequence[float], terms: Sequence[str]
) -> dict[str, float]:
    """The coefficient of each of ``terms`` (the features' columns, in order), fitted by
    ``fit_relative`` with the profile's signed terms (the stairs) signed."""
    fitted = fit_relative(features, times_s, signed_terms(terms))
    return dict(zip(terms, map(float, fitted), strict=True))


def fit_relative(
    features: Sequence[Sequence[float]], times_s: Sequence[float],
    signed: Sequence[bool] | None = None,
) -> np.ndarray:
    """Coefficients (one per feature column) minimising sum(((X c - t) / t)^2), each >= 0 but
    those ``signed`` marks that ``free_signed_terms`` keeps (the module docstring)."""
    matrix = np.asarray(features, dtype=np.float64)  # [num_points, num_terms]
    targets = np.asarray(times_s, dtype=np.float64)  # [num_points]
    if matrix.ndim != 2 or matrix.shape[0] != targets.shape[0]:
        raise ValueError(f"features {matrix.shape} and times {targets.shape} do not match")
    is_signed = np.zeros(matrix.shape[1], dtype=bool) if signed is None else np.asarray(signed)
    if is_signed.shape != (matrix.shape[1],):
        raise ValueError(f"{is_signed.shape[0]} signed flags for {matrix.shape[1]} terms")
    is_free = free_signed_terms(matrix, is_signed)  # [num_terms]
    weights = 1.0 / targets  # [num_points]
    weighted = matrix * weights[:, None]  # [num_points, num_terms]
    # Scale columns to unit norm so the solve is well conditioned (pairs reach 1e5, 1 is 1).
    norms = np.linalg.norm(weighted, axis=0)  # [num_terms]
    active = (norms > 0) & (is_free | ~is_signed)  # the others price nothing: 0
    coefficients = np.zeros(matrix.shape[1])  # [num_terms]
    if not active.any():
        return coefficients
    scaled_matrix = weighted[:, active] / norms[active]  # [num_points, num_active]
    free_active = is_free[active]  # [num_active]
    # A signed term's coefficient is its column's minus its negated column's, both >= 0.
    augmented = np.hstack([scaled_matrix, -scaled_matrix[:, free_active]])
    solution, _ = nnls(augmented, targets * weights, maxiter=50 * augmented.shape[1])
    num_active = scaled_matrix.shape[1]
    scaled = solution[:num_active].copy()  # [num_active]
    scaled[free_active] -= solution[num_active:]
    coefficients[active] = scaled / norms[active]
    return coefficients


def free_signed_terms(features: Sequence[Sequence[float]] | np.ndarray,
                      signed: Sequence[bool] | np.ndarray) -> np.ndarray:  # fmt: skip
    """Per column: whether ``fit_relative`` fits it with either sign: it is signed, and no
    column equal to it over the points is fitted in its place (a later one, or a non-signed
    one, which keeps the level they price >= 0)."""
    matrix = np.asarray(features, dtype=np.float64)  # [num_points, num_terms]
    is_signed = np.asarray(signed, dtype=bool)  # [num_terms]
    num_terms = matrix.shape[1]
    is_free = is_signed.copy()  # [num_terms]
    for term in np.flatnonzero(is_signed):
        others = [other for other in range(num_terms)
                  if other != term and (other > term or not is_signed[other])]  # fmt: skip
        is_free[term] = not any(np.array_equal(matrix[:, term], matrix[:, other])
                                for other in others)  # fmt: skip
    return is_free


def abs_pct_errors(predicted_s: Sequence[float], measured_s: Sequence[float]) -> np.ndarray:
    """|predicted - measured| / measured x 100, per point."""
    predicted = np.asarray(predicted_s, dtype=np.float64)
    measured = np.asarray(measured_s, dtype=np.float64)
    return np.abs(predicted - measured) / measured * 100
