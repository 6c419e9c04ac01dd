"""Shipped length profiles: small files, consistent tables, and fidelity to their traces.

Fidelity tolerance: sampling 100k requests reproduces mean, p50, p90 and p99 of prompt and output
within 3 % relative, or within 1 token where 3 % is less than a token (small medians such as
Alpaca's p50 = 14).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvbench.workloads import available_profiles, load_trace, sample_profile
from kvbench.workloads.profiles import (
    derive_profile,
    fine_bin_edges,
    load_profile,
    profile_from_tables,
    sample_lengths,
)
from kvbench.workloads.transforms import filter_vllm, length_statistics

TRACES_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
PROFILES = ("sharegpt", "alpaca", "azure_conv", "sharegpt_multiturn", "arxiv", "mooncake")
NUM_SAMPLES = 100_000
COMPARED = ("mean", "p50", "p90", "p99")


def _summary() -> pd.DataFrame:
    resource = files("kvbench.workload_data") / "profiles" / "summary.csv"
    with resource.open() as handle:
        return pd.read_csv(handle).set_index("name")


def _assert_close(got: float, expected: float, what: str) -> None:
    tolerance = max(0.03 * abs(expected), 1.0)
    assert abs(got - expected) <= tolerance, f"{what}: {got:.1f} vs trace {expected:.1f}"


@pytest.fixture(scope="module")
def samples() -> dict[str, pd.DataFrame]:
    return {name: sample_profile(name, NUM_SAMPLES, seed=0) for name in PROFILES}


def test_every_required_profile_ships():
    assert set(PROFILES) <= set(available_profiles())


@pytest.mark.parametrize("name", PROFILES)
def test_profile_files_are_small(name):
    folder = files("kvbench.workload_data") / "profiles"
    for file_name in (f"{name}.csv", f"{name}.marginals.csv"):
        num_bytes = len((folder / file_name).read_bytes())
        assert num_bytes < 100_000, f"{file_name}: {num_bytes} bytes"


@pytest.mark.parametrize("name", PROFILES)
def test_joint_and_marginals_agree(name):
    profile = load_profile(name)
    num_rows = int(_summary().loc[name, "rows"])
    assert profile.num_trace_rows == num_rows
    for axis, first, stop in ((profile.prompt, profile.prompt_first, profile.prompt_stop),
                              (profile.output, profile.output_first, profile.output_stop)):
        assert axis.cumulative[-1] == num_rows
        # Each band's joint counts add up to the fine counts inside it.
        bands = pd.DataFrame({"first": first, "stop": stop, "count": profile.cell_weights})
        per_band = bands.groupby(["first", "stop"])["count"].sum()
        for (band_first, band_stop), count in per_band.items():
            assert axis.cumulative[band_stop] - axis.cumulative[band_first] == count


@pytest.mark.parametrize("name", PROFILES)
def test_samples_match_the_recorded_trace_statistics(samples, name):
    recorded = _summary().loc[name]
    for column, prefix in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        got = length_statistics(samples[name][column])
        for key in COMPARED:
            _assert_close(got[key], recorded[f"{prefix}_{key}"], f"{name} {prefix} {key}")


TRACE_FILES = {
    "sharegpt": "sharegpt/sharegpt_val_10k_llama2.csv",
    "alpaca": "alpaca/alpaca_5000_gpt2bpe_lengths.csv",
    "azure_conv": "azure2023/AzureLLMInferenceTrace_conv.csv",
    "sharegpt_multiturn": "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "arxiv": "arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
    "mooncake": "mooncake/conversation_trace.jsonl",
}


@pytest.fixture(scope="module")
def traces() -> dict[str, pd.DataFrame]:
    if not TRACES_DIR.is_dir():
        pytest.skip(f"shared traces not found at {TRACES_DIR} (they are not shipped)")
    return {name: load_trace(TRACES_DIR / file) for name, file in TRACE_FILES.items()}


@pytest.mark.parametrize("name", PROFILES)
def test_samples_reproduce_the_trace(traces, samples, name):
    trace = traces[name]
    assert _summary().loc[name, "rows"] == len(trace)
    for column in ("prompt_tokens", "output_tokens"):
        expected = length_statistics(trace[column])
        got = length_statistics(samples[name][column])
        for key in COMPARED:
            _assert_close(got[key], expected[key], f"{name} {column} {key}")


@pytest.mark.parametrize("name", PROFILES)
def test_shipped_profile_is_what_derive_produces(traces, name):
    """The committed files are up to date with the trace (rerun derive_profiles.py if not)."""
    tables = derive_profile(traces[name])
    folder = files("kvbench.workload_data") / "profiles"
    with (folder / f"{name}.csv").open() as handle:
        pd.testing.assert_frame_equal(pd.read_csv(handle), tables.joint, check_dtype=False)


def test_vllm_filter_on_sharegpt_profile_matches_filtered_trace(traces, samples):
    filtered_trace = filter_vllm(traces["sharegpt"])
    filtered_sample = filter_vllm(samples["sharegpt"])
    assert len(filtered_sample) / NUM_SAMPLES == pytest.approx(0.8983, abs=0.005)
    for column in ("prompt_tokens", "output_tokens"):
        _assert_close(filtered_sample[column].mean(), filtered_trace[column].mean(),
                      f"filtered {column} mean")


def test_sampling_is_seeded():
    first = sample_profile("alpaca", 500, seed=11)
    assert first.equals(sample_profile("alpaca", 500, seed=11))
    assert not first.equals(sample_profile("alpaca", 500, seed=12))
    assert first["request_id"].tolist() == list(range(500))


def test_unknown_profile():
    with pytest.raises(ValueError, match="profile='nope' is unknown; expected one of sharegpt"):
        sample_profile("nope", 10)


def test_small_lengths_are_binned_exactly():
    frame = pd.DataFrame({"prompt_tokens": [3, 3, 7, 120], "output_tokens": [1, 2, 2, 9]})
    prompt, output = sample_lengths(profile_from_tables("tiny", derive_profile(frame)), 2000, 0)
    assert set(np.unique(prompt)) == {3, 7, 120}
    assert set(np.unique(output)) == {1, 2, 9}


def test_fine_bins_are_about_one_percent_wide_above_128():
    edges = fine_bin_edges(100_000)
    assert (np.diff(edges[:129]) == 1).all()
    widths = np.diff(edges)[128:]
    assert (widths <= 0.01 * edges[128:-1] + 1).all()  # 1 %, give or take the rounding
