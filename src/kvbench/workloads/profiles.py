"""Length profiles: what kvbench ships instead of traces, derived from them and sampled offline.

A full joint histogram at percentile-grade resolution would hold about one cell per trace row
(too big to ship, and close to the rows themselves). A profile instead stores

* for prompt and output separately, a fine histogram (exact below 128 tokens, 1 % bins above:
  exact bins keep small lengths, such as Alpaca's median prompt of 14 tokens, exact; 1 % bins
  bound the error of any percentile to about 1 % while a 126k-token range still needs only ~700
  bins): rows ``axis,lo,hi,count``;
* the joint histogram over coarse *bands*: each axis is cut, at fine-bin edges, into
  ``NUM_BANDS`` bands of about equal row count (a single length with many rows forms a band of
  its own): rows ``prompt_lo,prompt_hi,output_lo,output_hi,count``.

Sampling (:func:`sample_lengths`) picks a joint cell, then a fine bin inside each of its two
bands in proportion to the fine counts, then a length uniformly inside that fine bin. The
marginals are therefore reproduced at fine resolution, exactly in expectation, and the
prompt/output dependence at band resolution (2.5 % of the rows).

:func:`derive_profile` makes the tables from a trace (``workloads/derive_profiles.py`` runs it
on the shared traces). The shipped ones (``workloads/profiles``) are read through
``importlib.resources`` from the package ``kvbench.workload_data`` (the repository's top-level
``workloads/`` folder), so they work from an installed wheel and offline.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from importlib.resources import files

import numpy as np
import pandas as pd

from kvbench.workloads.frame import trace_frame
from kvbench.workloads.generators import SeedLike, as_generator
from kvbench.workloads.schema import OUTPUT_TOKENS, PROMPT_TOKENS

# Fine bins: one per length below 128 tokens, then each about 1 % wider than the one before.
EXACT_BELOW_TOKENS = 128
LOG_BIN_RATIO = 1.01
# The two tables of a profile: the joint one over NUM_BANDS bands per axis, and the marginals.
NUM_BANDS = 40
JOINT_COLUMNS = ("prompt_lo", "prompt_hi", "output_lo", "output_hi", "count")
MARGINAL_COLUMNS = ("axis", "lo", "hi", "count")
PROMPT_AXIS = "prompt"
OUTPUT_AXIS = "output"
# Where the shipped profiles live (package data).
PROFILE_DATA_PACKAGE = "kvbench.workload_data"
PROFILE_FOLDER = "profiles"
SUMMARY_FILE = "summary.csv"
MARGINALS_SUFFIX = ".marginals.csv"

# --- Fine bins ---


def fine_bin_edges(max_tokens: int) -> np.ndarray:
    """Lower edges of the fine bins covering 0..max_tokens; bin i is [edges[i], edges[i+1] - 1].

    The last edge is one past the last bin, so ``len(edges) - 1`` bins cover the range.
    """
    edges = list(range(min(EXACT_BELOW_TOKENS, max_tokens + 1) + 1))
    while edges[-1] <= max_tokens:
        edges.append(max(edges[-1] + 1, round(edges[-1] * LOG_BIN_RATIO)))
    return np.asarray(edges, dtype="int64")


def fine_bin_index(tokens: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Index of the fine bin holding each token count."""
    return np.searchsorted(edges, tokens, side="right") - 1


# --- Deriving a profile from a trace ---


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


# --- Shipped profiles, and sampling from them ---


def profile_file_names(name: str) -> tuple[str, str]:
    """File names of a profile's joint table and of its marginals table."""
    return f"{name}.csv", f"{name}{MARGINALS_SUFFIX}"


@dataclass(frozen=True)
class _AxisSampler:
    """Inverse-CDF sampling of one axis restricted to a band of its fine bins."""

    fine_lo: np.ndarray
    fine_hi: np.ndarray
    cumulative: np.ndarray  # cumulative[i] = rows in fine bins before bin i; len = bins + 1

    @classmethod
    def from_marginal(cls, marginal: pd.DataFrame) -> _AxisSampler:
        ordered = marginal.sort_values("lo")
        counts = ordered["count"].to_numpy(dtype="int64")
        return cls(ordered["lo"].to_numpy(dtype="int64"), ordered["hi"].to_numpy(dtype="int64"),
                   np.concatenate(([0], np.cumsum(counts))))

    def fine_range(self, band_lo: np.ndarray, band_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and one-past-last fine bin inside each band [band_lo, band_hi]."""
        return (np.searchsorted(self.fine_lo, band_lo, side="left"),
                np.searchsorted(self.fine_hi, band_hi, side="right"))

    def sample(self, first: np.ndarray, stop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One length per entry: a fine bin in [first, stop) weighted by its count, then a
        length uniform within it."""
        low_rank = self.cumulative[first]
        rank = low_rank + rng.random(len(first)) * (self.cumulative[stop] - low_rank)
        fine = np.clip(np.searchsorted(self.cumulative, rank, side="right") - 1, first, stop - 1)
        return rng.integers(self.fine_lo[fine], self.fine_hi[fine] + 1)


@dataclass(frozen=True)
class LengthProfile:
    """A loaded length profile, ready to sample."""

    name: str
    cell_weights: np.ndarray
    prompt_first: np.ndarray  # per joint cell: its prompt band as a fine-bin range
    prompt_stop: np.ndarray
    output_first: np.ndarray
    output_stop: np.ndarray
    prompt: _AxisSampler
    output: _AxisSampler

    @property
    def num_trace_rows(self) -> int:
        """Rows of the trace the profile was derived from."""
        return int(self.cell_weights.sum())


def profile_from_tables(name: str, tables: ProfileTables) -> LengthProfile:
    """A samplable profile from its joint and marginal tables."""
    marginals = tables.marginals
    prompt = _AxisSampler.from_marginal(marginals[marginals["axis"] == PROMPT_AXIS])
    output = _AxisSampler.from_marginal(marginals[marginals["axis"] == OUTPUT_AXIS])
    joint = tables.joint
    prompt_first, prompt_stop = prompt.fine_range(joint["prompt_lo"].to_numpy(),
                                                  joint["prompt_hi"].to_numpy())
    output_first, output_stop = output.fine_range(joint["output_lo"].to_numpy(),
                                                  joint["output_hi"].to_numpy())
    if (prompt_stop <= prompt_first).any() or (output_stop <= output_first).any():
        raise ValueError(f"profile {name!r}: a joint cell covers no fine bin; expected bands "
                         f"that cut the fine bins at their edges")
    return LengthProfile(
        name=name, cell_weights=joint["count"].to_numpy(dtype="int64"),
        prompt_first=prompt_first, prompt_stop=prompt_stop,
        output_first=output_first, output_stop=output_stop, prompt=prompt, output=output,
    )


def _read_profile_csv(file_name: str) -> pd.DataFrame:
    resource = files(PROFILE_DATA_PACKAGE) / PROFILE_FOLDER / file_name
    return pd.read_csv(io.StringIO(resource.read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=1)
def profile_summaries() -> pd.DataFrame:
    """One row per shipped profile: the statistics of the trace it was derived from."""
    return _read_profile_csv(SUMMARY_FILE).set_index("name")


def available_profiles() -> tuple[str, ...]:
    """Names of the shipped profiles (``sharegpt``, ``alpaca``, ``azure_conv``, ...)."""
    return tuple(profile_summaries().index)


@functools.cache
def load_profile(name: str) -> LengthProfile:
    """The shipped profile ``name``.

    Raises:
        ValueError: no profile of that name ships with kvbench.
    """
    if name not in available_profiles():
        raise ValueError(f"profile={name!r} is unknown; expected one of "
                         f"{', '.join(available_profiles())}")
    joint_file, marginals_file = profile_file_names(name)
    tables = ProfileTables(joint=_read_profile_csv(joint_file),
                           marginals=_read_profile_csv(marginals_file))
    return profile_from_tables(name, tables)


def sample_lengths(
    profile: LengthProfile, num_requests: int, seed: SeedLike = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``num_requests`` (prompt_tokens, output_tokens) pairs drawn from ``profile``."""
    rng = as_generator(seed)
    probabilities = profile.cell_weights / profile.cell_weights.sum()
    cells = rng.choice(len(probabilities), size=num_requests, p=probabilities)
    prompt_tokens = profile.prompt.sample(profile.prompt_first[cells], profile.prompt_stop[cells],
                                          rng)
    output_tokens = profile.output.sample(profile.output_first[cells], profile.output_stop[cells],
                                          rng)
    return prompt_tokens.astype("int64"), output_tokens.astype("int64")


def sample_profile(name: str, num_requests: int, seed: SeedLike = 0) -> pd.DataFrame:
    """``num_requests`` requests with lengths drawn from the shipped profile ``name``.

    Returns the canonical trace columns (``arrival_s`` NaN: no arrivals yet), unfiltered: apply
    ``filter_vllm`` / ``clip_to_max_len`` as the experiment needs (``build_workload`` does).
    """
    if num_requests < 1:
        raise ValueError(f"num_requests={num_requests} is invalid; expected an integer >= 1")
    prompt_tokens, output_tokens = sample_lengths(load_profile(name), num_requests, seed)
    frame = trace_frame(prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    frame.attrs["profile"] = name
    return frame
