"""The length profiles kvbench ships (``workloads/profiles``), and sampling requests from them.

Profiles are read through ``importlib.resources`` from the package ``kvbench.workload_data``
(the repository's top-level ``workloads/`` folder), so they work from an installed wheel and
offline. ``profile_derive`` documents the format.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from importlib.resources import files

import numpy as np
import pandas as pd

from kvbench.workloads.frames import trace_frame
from kvbench.workloads.profile_derive import OUTPUT_AXIS, PROMPT_AXIS, ProfileTables
from kvbench.workloads.seeding import SeedLike, as_generator

PROFILE_DATA_PACKAGE = "kvbench.workload_data"
PROFILE_FOLDER = "profiles"
SUMMARY_FILE = "summary.csv"
MARGINALS_SUFFIX = ".marginals.csv"


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
