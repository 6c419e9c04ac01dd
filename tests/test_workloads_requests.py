"""to_requests: DataFrame rows to frozen Request records, and back."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.core.request import Request
from kvbench.workloads import to_requests


def _requests_frame(requests: list[Request], hash_block_tokens: int) -> pd.DataFrame:
    frame = pd.DataFrame({
        "request_id": [r.request_id for r in requests],
        "arrival_s": [r.arrival_s for r in requests],
        "prompt_tokens": [r.prompt_tokens for r in requests],
        "output_tokens": [r.output_tokens for r in requests],
        "prefix_group": pd.array([r.prefix_group for r in requests], dtype="Int64"),
        "prefix_tokens": [r.prefix_tokens for r in requests],
        "prefix_block_hashes": [list(r.prefix_block_hashes) for r in requests],
    })
    frame.attrs["hash_block_tokens"] = hash_block_tokens
    return frame


request_strategy = st.builds(
    Request,
    request_id=st.integers(0, 10**9),
    arrival_s=st.floats(0, 1e6, allow_nan=False),
    prompt_tokens=st.integers(0, 200_000),
    output_tokens=st.integers(0, 5000),
    prefix_group=st.none() | st.integers(0, 100),
    prefix_tokens=st.integers(0, 4096),
    prefix_block_hashes=st.lists(st.integers(0, 2**62), max_size=5).map(tuple),
    hash_block_tokens=st.just(512),
)


@given(st.lists(request_strategy, min_size=1, max_size=20))
@settings(max_examples=50, deadline=None)
def test_round_trip(requests):
    assert to_requests(_requests_frame(requests, 512)) == requests


def test_minimal_frame_maps_to_defaults():
    frame = pd.DataFrame({"request_id": np.array([0, 1]), "arrival_s": [0.0, 0.5],
                          "prompt_tokens": np.array([10, 20]), "output_tokens": np.array([1, 2])})
    requests = to_requests(frame)
    assert requests == [Request(0, 0.0, 10, 1), Request(1, 0.5, 20, 2)]
    assert all(isinstance(r.prompt_tokens, int) for r in requests)


def test_frame_without_arrivals_is_refused():
    frame = pd.DataFrame({"request_id": [0], "arrival_s": [np.nan], "prompt_tokens": [1],
                          "output_tokens": [1]})
    with pytest.raises(ValueError, match="row 1 has arrival_s NaN"):
        to_requests(frame)
