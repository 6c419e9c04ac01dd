"""The lpm policy (SGLang's longest prefix match first) next to FCFS."""

from __future__ import annotations

import pytest
from conftest import compose_config

from kvbench.allocators import PagedAllocator, RadixAllocator
from kvbench.config import ConfigError
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate

DEPLOYMENT = get_deployment("llama-3-8b", "a100-80gb")


def _workload() -> list[Request]:
    """A request of group 1 is running when three arrive: of groups 2 and 3 (nothing cached)
    and of group 1 (its 512-token prefix cached); one seat is free per iteration."""
    running = Request(0, 0.0, 600, 50, prefix_group=1, prefix_tokens=512)
    later = [
        Request(1, 0.001, 600, 5, prefix_group=2, prefix_tokens=512),
        Request(2, 0.001, 600, 5, prefix_group=3, prefix_tokens=512),
        Request(3, 0.001, 600, 5, prefix_group=1, prefix_tokens=512),
    ]
    return [running, *later]


def _admission_order(policy: str, allocator) -> list[int]:
    limits = SchedulerLimits(max_model_len=4096, max_num_seqs=2, policy=policy)
    result = simulate(_workload(), Scheduler(limits), allocator, RooflineCostModel(DEPLOYMENT))
    records = sorted(result.requests, key=lambda record: record.admit_s)
    return [record.request_id for record in records]


@pytest.mark.parametrize("make", [
    lambda: PagedAllocator(100_000, 16, 4096, enable_prefix_caching=True),
    lambda: RadixAllocator(100_000, 4096),
])
def test_lpm_admits_the_longest_cached_prefix_first(make) -> None:
    assert _admission_order("fcfs", make()) == [0, 1, 2, 3]
    assert _admission_order("lpm", make()) == [0, 3, 1, 2]


def test_lpm_without_a_prefix_cache_is_fcfs() -> None:
    assert _admission_order("lpm", PagedAllocator(100_000, 16, 4096)) == [0, 1, 2, 3]


def test_lpm_hits_more_than_fcfs_when_the_cache_is_small() -> None:
    """Four groups, their requests interleaved, a cache of about one group's prefix: lpm
    serves a group while it is cached; fcfs evicts it before its next request comes up."""
    requests = [Request(i, 0.0, 1100, 20, prefix_group=i % 4, prefix_tokens=1024)
                for i in range(40)]  # fmt: skip
    hits = {}
    for policy in ("fcfs", "lpm"):
        limits = SchedulerLimits(max_model_len=4096, max_num_seqs=1, policy=policy)
        result = simulate(requests, Scheduler(limits), RadixAllocator(2_600, 4096),
                          RooflineCostModel(DEPLOYMENT))  # fmt: skip
        hits[policy] = sum(record.cached_prompt_tokens for record in result.requests)
    assert hits["fcfs"] == 0
    assert hits["lpm"] == 4 * 9 * 1024  # each group: its first request misses, 9 hit


def test_the_fast_flag_gives_the_same_records_under_lpm() -> None:
    requests = [Request(i, 0.01 * i, 300 + 7 * i, 30, prefix_group=i % 3, prefix_tokens=256)
                for i in range(30)]  # fmt: skip
    results = []
    for fast in (True, False):
        limits = SchedulerLimits(max_model_len=4096, max_num_seqs=4, policy="lpm")
        results.append(simulate(requests, Scheduler(limits), RadixAllocator(3_000, 4096),
                                RooflineCostModel(DEPLOYMENT), fast=fast))  # fmt: skip
    assert results[0].steps.columns == results[1].steps.columns
    assert results[0].requests == results[1].requests


def test_an_unknown_policy_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"scheduler.policy='sjf': allowed are fcfs, lpm"):
        compose_config("scheduler.policy=sjf")
    with pytest.raises(ValueError, match="policy='sjf'"):
        Scheduler(SchedulerLimits(max_model_len=16, policy="sjf"))
