"""Derive a compact length profile from a trace: fine marginals plus a coarse joint histogram.

A full joint histogram at percentile-grade resolution would hold about one cell per trace row
(too big to ship, and close to the rows themselves). A profile instead stores

* for prompt and output separately, a fine histogram (``binning``: exact below 128 tokens,
  1 % bins above): rows ``axis,lo,hi,count``;
* the joint histogram over coarse *bands*: each axis is cut, at fine-bin edges, into
  ``NUM_BANDS`` bands of about equal row count (a single length with many rows forms a band of
  its own): rows ``prompt_lo,prompt_hi,output_lo,output_hi,count``.

Sampling (``profiles.sample_lengths``) picks a joint cell, then a fine bin inside each of its two
bands in proportion to the fine counts, then a length uniformly inside that fine bin. The
marginals are therefore reproduced at fine resolution, exactly in expectation, and the
prompt/output dependence at band resolution (2.5 % of the rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvbench.workloads.binning import fine_bin_edges, fine_bin_index
from kvbench.workloads.columns import OUTPUT_TOKENS, PROMPT_TOKENS

NUM_BANDS = 40
JOINT_COLUMNS = ("prompt_lo", "prompt_hi", "output_lo", "output_hi", "count")
MARGINAL_COLUMNS = ("axis", "lo", "hi", "count")
PROMPT_AXIS = "prompt"
OUTPUT_AXIS = "output"


@dataclass(frozen=True)
class ProfileTables:
    """A length profile as the two tables it is shipped as."""

    joint: pd.DataFrame
    marginals: pd.DataFrame


@dataclass(frozen=True)
class _AxisBinning:
    fine_lo: np.ndarray  # occupied fine bins only
    fine_hi: np.ndarray
    fine_count: np.ndarray
    band_of_fine: np.ndarray  # band id of each occupied fine bin
    band_of_row: np.ndarray  # band id of each trace row


def equal_count_bands(fine_count: np.ndarray, num_bands: int) -> np.ndarray:
    """Band id (0-based, consecutive) of each fine bin: bands of about equal total count.

    A fine bin goes to band floor(rows before it * num_bands / total), so a bin holding more
    than 1/num_bands of the rows closes its band alone.
    """
    rows_before = np.cumsum(fine_count) - fine_count
    raw_band = np.minimum(rows_before * num_bands // fine_count.sum(), num_bands - 1)
    return np.unique(raw_band, return_inverse=True)[1]


def _bin_axis(tokens: np.ndarray, num_bands: int) -> _AxisBinning:
    edges = fine_bin_edges(int(tokens.max()))
    fine_of_row = fine_bin_index(tokens, edges)
    occupied, fine_position_of_row, fine_count = np.unique(
        fine_of_row, return_inverse=True, return_counts=True
    )
    band_of_fine = equal_count_bands(fine_count, num_bands)
    return _AxisBinning(
        fine_lo=edges[occupied], fine_hi=edges[occupied + 1] - 1, fine_count=fine_count,
        band_of_fine=band_of_fine, band_of_row=band_of_fine[fine_position_of_row],
    )


def _band_ranges(axis: _AxisBinning) -> tuple[np.ndarray, np.ndarray]:
    num_bands = int(axis.band_of_fine.max()) + 1
    band_lo = np.full(num_bands, np.iinfo("int64").max)
    band_hi = np.zeros(num_bands, dtype="int64")
    np.minimum.at(band_lo, axis.band_of_fine, axis.fine_lo)
    np.maximum.at(band_hi, axis.band_of_fine, axis.fine_hi)
    return band_lo, band_hi


def _marginal_table(name: str, axis: _AxisBinning) -> pd.DataFrame:
    return pd.DataFrame({"axis": name, "lo": axis.fine_lo, "hi": axis.fine_hi,
                         "count": axis.fine_count})


def derive_profile(df: pd.DataFrame, num_bands: int = NUM_BANDS) -> ProfileTables:
    """The profile tables of the ``prompt_tokens``/``output_tokens`` columns of ``df``."""
    if df.empty:
        raise ValueError("derive_profile: the trace has no rows")
    prompt = _bin_axis(df[PROMPT_TOKENS].to_numpy(dtype="int64"), num_bands)
    output = _bin_axis(df[OUTPUT_TOKENS].to_numpy(dtype="int64"), num_bands)
    cells = pd.DataFrame({"prompt_band": prompt.band_of_row, "output_band": output.band_of_row})
    cell_counts = cells.value_counts().sort_index().reset_index(name="count")
    prompt_lo, prompt_hi = _band_ranges(prompt)
    output_lo, output_hi = _band_ranges(output)
    joint = pd.DataFrame({
        "prompt_lo": prompt_lo[cell_counts["prompt_band"]],
        "prompt_hi": prompt_hi[cell_counts["prompt_band"]],
        "output_lo": output_lo[cell_counts["output_band"]],
        "output_hi": output_hi[cell_counts["output_band"]],
        "count": cell_counts["count"].to_numpy(),
    })
    marginals = pd.concat([_marginal_table(PROMPT_AXIS, prompt),
                           _marginal_table(OUTPUT_AXIS, output)], ignore_index=True)
    return ProfileTables(joint=joint, marginals=marginals)
