"""Multi-turn traces without conversation ids (ShareGPT multi-turn): the history consecutive
turns share, named for the prefix caches (workload.conversations)."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.allocators import RadixAllocator
from kvbench.core.catalog import get_deployment
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.workloads import WorkloadConfig, to_requests, validate_workload_config
from kvbench.workloads.frame import trace_frame
from kvbench.workloads.transforms import conversation_prefixes


def _turns():
    # Turns 0-2 grow by at least the previous prompt + output; turn 3 does not (a new
    # conversation); turn 4 continues turn 3.
    return trace_frame(np.array([10, 30, 50, 5, 20]), np.array([10, 5, 3, 10, 2]),
                       arrival_s=np.arange(5, dtype=float))  # fmt: skip


def test_a_turn_continues_when_its_prompt_holds_the_previous_turn() -> None:
    frame = conversation_prefixes(_turns())
    assert frame["prefix_group"].to_list() == [0, 0, 0, 1, 1]
    assert frame["prefix_tokens"].to_list() == [10, 30, 50, 5, 20]


def test_each_turn_hits_the_previous_turns_prompt() -> None:
    requests = to_requests(conversation_prefixes(_turns()))
    limits = SchedulerLimits(max_model_len=4096)
    result = simulate(requests, Scheduler(limits), RadixAllocator(10_000, 4096),
                      RooflineCostModel(get_deployment("llama-3-8b", "a100-80gb")))  # fmt: skip
    assert [record.cached_prompt_tokens for record in result.requests] == [0, 10, 30, 0, 5]


def test_conversations_need_a_trace() -> None:
    with pytest.raises(ValueError, match=r"workload.conversations=True is invalid; expected "
                                         r"false unless workload.source=trace"):
        validate_workload_config(WorkloadConfig(name="sharegpt", conversations=True))
