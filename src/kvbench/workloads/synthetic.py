"""Synthetic workloads: fixed lengths, and many users behind one shared system prompt."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.workloads.columns import PREFIX_GROUP, PREFIX_TOKENS
from kvbench.workloads.frames import trace_frame


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name}={value} is invalid; expected an integer >= 1")


def fixed_workload(num_requests: int, prompt_tokens: int, output_tokens: int) -> pd.DataFrame:
    """``num_requests`` identical requests (no arrival times yet: arrival_s is NaN)."""
    for name, value in (("num_requests", num_requests), ("prompt_tokens", prompt_tokens),
                        ("output_tokens", output_tokens)):
        _check_positive(name, value)
    return trace_frame(
        prompt_tokens=np.full(num_requests, prompt_tokens, dtype="int64"),
        output_tokens=np.full(num_requests, output_tokens, dtype="int64"),
    )


def system_prompt_workload(
    num_users: int, system_prompt_tokens: int, prompt_tokens: int, output_tokens: int
) -> pd.DataFrame:
    """One request per user, all starting with the same system prompt.

    Each request's prompt is ``system_prompt_tokens`` shared tokens followed by ``prompt_tokens``
    tokens of its own; every row has ``prefix_group`` 0 and ``prefix_tokens`` =
    ``system_prompt_tokens``, so a prefix-sharing allocator can store the system prompt once.
    """
    for name, value in (("num_users", num_users), ("system_prompt_tokens", system_prompt_tokens),
                        ("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        _check_positive(name, value)
    frame = fixed_workload(num_users, system_prompt_tokens + prompt_tokens, output_tokens)
    frame[PREFIX_GROUP] = np.zeros(num_users, dtype="int64")
    frame[PREFIX_TOKENS] = np.full(num_users, system_prompt_tokens, dtype="int64")
    return frame
