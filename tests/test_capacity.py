"""Fleet sizing from knees: replicas, GPUs, cost, and memory held vs used."""

import math

import pandas as pd
import pytest

from kvbench.analysis.capacity import fleet_frame, replicas_needed, with_fleet_memory
from kvbench.tasks.simulate.run import MAX_EXTRA_REPLICAS, replicas_meeting_bound

KEYS = {"experiment": "e", "workload": "w", "model": "m", "hardware": "h", "num_gpus": 4,
        "block_size": 16, "preemption": "recompute"}  # fmt: skip


def _knees() -> pd.DataFrame:
    return pd.DataFrame([
        {**KEYS, "allocator": "naive_max", "knee_rate": 3.0, "knee_censored": False},
        {**KEYS, "allocator": "paged", "knee_rate": 10.0, "knee_censored": True},
        {**KEYS, "allocator": "naive_pow2", "knee_rate": math.nan, "knee_censored": False},
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("target", "knee", "expected"),
    [(10, 5, 2), (10, 3, 4), (4, 2.0000000001, 2), (1, 10, 1)],
)
def test_replicas_are_the_ceiling_of_target_over_knee(target, knee, expected):
    assert replicas_needed(target, knee) == expected


@pytest.mark.parametrize("knee", [0.0, math.nan])
def test_no_replica_count_when_a_replica_cannot_meet_the_bound(knee):
    assert math.isnan(replicas_needed(10, knee))


def test_fleet_gpus_and_cost_follow_replicas():
    fleet = fleet_frame(_knees(), target_rate=20, price_per_gpu_hour=2.5).set_index("allocator")
    assert fleet.loc["naive_max", "replicas"] == 7
    assert fleet.loc["naive_max", "gpus"] == 28
    assert fleet.loc["naive_max", "cost_per_hour"] == pytest.approx(70.0)
    assert fleet.loc["naive_max", "operating_rate_per_replica"] == pytest.approx(20 / 7)
    assert fleet.loc["paged", "replicas"] == 2 and fleet.loc["paged", "replicas_upper_bound"]
    assert math.isnan(fleet.loc["naive_pow2", "gpus"])


def test_measured_replicas_override_the_knee_count():
    paged_row = list(_knees()["allocator"]).index("paged")
    fleet = fleet_frame(_knees(), 20, 2.5, replicas={paged_row: 3}).set_index("allocator")
    assert fleet.loc["paged", "replicas_from_knee"] == 2
    assert fleet.loc["paged", "replicas"] == 3 and fleet.loc["paged", "gpus"] == 12


def test_fleet_memory_is_per_replica_memory_times_replicas():
    fleet = fleet_frame(_knees().iloc[:2], 20, 2.5)
    operating = pd.DataFrame([
        {**KEYS, "allocator": "naive_max", "kv_pool_gb": 100.0, "kv_held_gb": 90.0,
         "token_states_gb": 9.0, "normalized_latency_s_per_token": 0.05},
        {**KEYS, "allocator": "paged", "kv_pool_gb": 100.0, "kv_held_gb": 30.0,
         "token_states_gb": 29.0, "normalized_latency_s_per_token": 0.04},
    ])  # fmt: skip
    merged = with_fleet_memory(fleet, operating).set_index("allocator")
    assert merged.loc["naive_max", "kv_held_gb"] == pytest.approx(90.0 * 7)
    assert merged.loc["naive_max", "kv_used_gb"] == pytest.approx(9.0 * 7)
    assert merged.loc["naive_max", "kv_held_over_used"] == pytest.approx(10.0)
    assert merged.loc["paged", "kv_pool_gb_fleet"] == pytest.approx(200.0)
    assert merged.loc["paged", "operating_latency_s_per_token"] == 0.04


def _latency_by_replicas(latencies: dict[int, float], measured: list[int]):
    def measure(count: int) -> pd.DataFrame:
        measured.append(count)
        return pd.DataFrame({"normalized_latency_s_per_token": [latencies[count]]})

    return measure


def test_replicas_are_added_until_the_measured_latency_meets_the_bound():
    measured: list[int] = []
    count, row = replicas_meeting_bound(_latency_by_replicas({3: 0.2, 4: 0.09}, measured), 3, 0.1)
    assert (count, measured, row["normalized_latency_s_per_token"].iloc[0]) == (4, [3, 4], 0.09)


def test_a_fleet_that_never_meets_the_bound_keeps_the_last_count_it_measured():
    measured: list[int] = []
    latencies = dict.fromkeys(range(3, 3 + MAX_EXTRA_REPLICAS + 1), 0.5)
    count, row = replicas_meeting_bound(_latency_by_replicas(latencies, measured), 3, 0.1)
    assert count == measured[-1] == 3 + MAX_EXTRA_REPLICAS  # not one more than was run
    assert row["normalized_latency_s_per_token"].iloc[0] > 0.1
