"""Pure transforms: vLLM's filter, clipping to a context length, seeded sampling, synthetic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.workloads import (
    clip_to_max_len,
    filter_vllm,
    fixed_workload,
    sample_requests,
    sort_and_renumber,
    system_prompt_workload,
)
from kvbench.workloads.frame import trace_frame

lengths = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000)), min_size=1,
                   max_size=60)


def _frame(pairs: list[tuple[int, int]]) -> pd.DataFrame:
    prompt, output = zip(*pairs, strict=True)
    frame = trace_frame(np.array(prompt), np.array(output))
    frame.attrs["hash_block_tokens"] = 16
    return frame


def test_filter_vllm_bounds_are_inclusive():
    frame = _frame([(4, 4), (3, 10), (10, 3), (1024, 1024), (1025, 4), (1000, 1049), (1000, 1048)])
    kept = filter_vllm(frame)
    assert list(zip(kept["prompt_tokens"], kept["output_tokens"], strict=True)) == [
        (4, 4), (1024, 1024), (1000, 1048)]


def test_filter_vllm_bounds_can_be_overridden():
    frame = _frame([(1, 1), (3000, 10)])
    assert len(filter_vllm(frame, 1, 1, 4096, 8192)) == 2


@given(lengths, st.integers(0, 8), st.integers(0, 8), st.integers(1, 3000), st.integers(1, 6000))
@settings(max_examples=60, deadline=None)
def test_filter_keeps_exactly_the_rows_within_bounds(pairs, min_prompt, min_output, max_prompt,
                                                     max_total):
    frame = _frame(pairs)
    kept = filter_vllm(frame, min_prompt, min_output, max_prompt, max_total)
    expected = [(p, o) for p, o in pairs
                if p >= min_prompt and o >= min_output and p <= max_prompt and p + o <= max_total]
    assert list(zip(kept["prompt_tokens"], kept["output_tokens"], strict=True)) == expected
    assert kept.attrs["hash_block_tokens"] == 16
    assert len(frame) == len(pairs)  # the input is untouched


@given(lengths, st.integers(1, 6000))
@settings(max_examples=60, deadline=None)
def test_clip_invariants(pairs, max_model_len):
    frame = _frame(pairs)
    clipped = clip_to_max_len(frame, max_model_len)
    # Every row stays, in order: a prompt that fills the context is kept for the engine to
    # reject (and count); the others have their output clipped to the room left.
    assert clipped["request_id"].tolist() == list(range(len(pairs)))
    assert clipped["prompt_tokens"].tolist() == [p for p, _ in pairs]
    assert clipped["requested_output_tokens"].tolist() == [o for _, o in pairs]
    assert clipped["output_tokens"].tolist() == [
        min(o, max_model_len - p) if p < max_model_len else o for p, o in pairs
    ]
    fits = clipped["prompt_tokens"] < max_model_len
    assert ((clipped["prompt_tokens"] + clipped["output_tokens"])[fits] <= max_model_len).all()
    assert "requested_output_tokens" not in frame.columns  # the input is untouched


def test_clip_keeps_prompts_that_reach_the_limit_and_records_what_it_cut():
    clipped = clip_to_max_len(_frame([(2048, 5), (2047, 5), (100, 4000), (10**18, 3)]), 2048)
    assert clipped["prompt_tokens"].tolist() == [2048, 2047, 100, 10**18]
    assert clipped["output_tokens"].tolist() == [5, 1, 1948, 3]
    assert clipped["requested_output_tokens"].tolist() == [5, 5, 4000, 3]


def test_sampling_is_seeded_and_without_replacement_when_possible():
    frame = _frame([(i, i) for i in range(100)])
    first = sample_requests(frame, 50, seed=3)
    assert first.equals(sample_requests(frame, 50, seed=3))
    assert not first.equals(sample_requests(frame, 50, seed=4))
    assert first["request_id"].is_unique


def test_sampling_more_than_the_rows_uses_replacement():
    frame = _frame([(i, i) for i in range(10)])
    sampled = sample_requests(frame, 1000, seed=0)
    assert len(sampled) == 1000
    assert set(sampled["request_id"]) == set(range(10))
    with pytest.raises(ValueError, match="exceeds the 10 rows"):
        sample_requests(frame, 11, seed=0, replace=False)


def test_sort_and_renumber_is_stable():
    frame = trace_frame(np.array([1, 2, 3]), np.array([1, 1, 1]),
                        arrival_s=np.array([2.0, 1.0, 1.0]))
    ordered = sort_and_renumber(frame)
    assert ordered["prompt_tokens"].tolist() == [2, 3, 1]
    assert ordered["request_id"].tolist() == [0, 1, 2]


def test_fixed_workload():
    frame = fixed_workload(3, 100, 47)
    assert frame["prompt_tokens"].tolist() == [100] * 3
    assert frame["output_tokens"].tolist() == [47] * 3
    assert frame["arrival_s"].isna().all()
    with pytest.raises(ValueError, match="prompt_tokens=0 is invalid"):
        fixed_workload(3, 0, 47)


def test_system_prompt_workload_shares_one_prefix_group():
    frame = system_prompt_workload(num_users=4, system_prompt_tokens=1024, prompt_tokens=64,
                                   output_tokens=10)
    assert len(frame) == 4
    assert frame["prompt_tokens"].tolist() == [1088] * 4
    assert frame["prefix_group"].tolist() == [0] * 4
    assert frame["prefix_tokens"].tolist() == [1024] * 4
