"""Beam search: beams forked and freed along recorded ancestry, the shipped table, the config."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kvbench.allocators import make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.engine.beams import plan_step, recorded_parents
from kvbench.workloads import WorkloadConfig, build_workload, to_requests, validate_workload_config
from kvbench.workloads.beam_ancestry import (
    ANCESTRY_COLUMNS,
    load_beam_ancestry,
    read_ancestry_table,
    search_statistics,
    validate_ancestry,
)

COSTS = RooflineCostModel(get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12))
LIMITS = SchedulerLimits(max_model_len=2048)
# One recorded search of width 2: step 1 drops beam 1 and forks beam 0, step 2 swaps the two,
# step 3 drops beam 0 and forks beam 1.
HAND_ANCESTRY = {2: [((0, 0), (0, 0), (1, 0), (1, 1))]}


def _run(allocator, requests, ancestry=HAND_ANCESTRY):
    return simulate(requests, Scheduler(LIMITS), allocator, COSTS, beam_ancestry=ancestry)


def test_plan_step_drops_childless_beams_and_forks_the_extra_children():
    assert plan_step((0, 1, 2)) == ([], [])
    assert plan_step((0, 0)) == ([1], [(1, 0)])
    assert plan_step((1, 1, 0, 1)) == ([2, 3], [(1, 1), (3, 1)])


def test_steps_past_the_recording_wrap_around_to_step_1():
    request = Request(request_id=5, arrival_s=0.0, prompt_tokens=4, output_tokens=9, beam_width=2)
    ancestry = {2: [((0, 0), (1, 1), (0, 0), (1, 0))]}  # T = 4
    assert [recorded_parents(ancestry, request, s) for s in (1, 3, 4, 6, 7)] == [
        (1, 1), (1, 0), (1, 1), (1, 0), (1, 1)]  # fmt: skip
    with pytest.raises(ValueError, match="beam_width=3 has no recorded beam ancestry"):
        recorded_parents(ancestry, Request(0, 0.0, 4, 9, beam_width=3), 1)


def test_hand_made_ancestry_gives_exact_blocks_saved_slots_and_copies():
    # Block size 4, prompt 6 + 5 output tokens, k = 2. Prefill holds A (4) + B (3, partial);
    # the fork shares A, B. Step 2: beam 0's write copies B -> C (CoW 1), beam 1 writes B;
    # then beam 1 is dropped (B freed) and beam 0 forked: both hold [A, C]. Step 3: each starts a
    # block (D, E): 4 held, 6 logical. Step 4: swap, no allocator change. Then beam 0 ([A, C, E])
    # is dropped (E freed) and beam 1 ([A, C, D]) forked with D partial: step 5's first write
    # copies D (CoW 2).
    allocator = make_allocator("paged", 64, 4, 2048)
    request = Request(request_id=0, arrival_s=0.0, prompt_tokens=6, output_tokens=5, beam_width=2)
    result = _run(allocator, [request])
    assert result.requests[0].status == "finished"
    columns = result.steps.columns
    assert list(columns["saved_slots"]) == [0, 4, 8, 8, 8]
    held = [
        t + r + i
        for t, r, i in zip(columns["token_states_slots"], columns["reservation_slots"],
                           columns["internal_frag_slots"], strict=True)
    ]  # fmt: skip
    assert held == [2 * 4, 3 * 4, 4 * 4, 4 * 4, 4 * 4]
    assert result.num_copy_on_writes == 2
    assert list(columns["batch_size"]) == [1, 2, 2, 2, 2]
    assert allocator.usage().free == 64  # nothing leaks


def test_without_beam_search_the_same_request_holds_one_sequence():
    allocator = make_allocator("paged", 64, 4, 2048)
    result = _run(allocator, [Request(0, 0.0, 6, 5)])
    assert list(result.steps.columns["batch_size"]) == [1] * 5
    assert result.num_copy_on_writes == 0


@pytest.mark.parametrize("allocator_name", ["naive_max", "naive_pow2", "naive_oracle", "paged",
                                            "paged_prefix"])  # fmt: skip
def test_a_beam_run_finishes_every_request_and_leaks_nothing(allocator_name):
    requests = [
        Request(request_id=i, arrival_s=0.05 * i, prompt_tokens=20 + 7 * i,
                output_tokens=40 + 13 * (i % 5), beam_width=(2, 4, 6)[i % 3])
        for i in range(12)
    ]  # fmt: skip
    # A small pool: paged preempts, and preempted beams come back as sequences of their own.
    allocator = make_allocator(allocator_name, 2048, 16, 2048)
    result = _run(allocator, requests, load_beam_ancestry())
    assert all(record.status == "finished" for record in result.requests)
    usage = allocator.usage()
    assert usage.token_states == usage.reservation == usage.internal_frag == 0
    assert usage.shared_slots == usage.saved_slots == 0
    decode = sum(result.steps.columns["num_decode_tokens"])
    if allocator_name.startswith("paged"):
        assert max(result.steps.columns["saved_slots"]) > 0
        assert result.num_copy_on_writes > 0
    else:
        assert max(result.steps.columns["saved_slots"]) == 0
    # every beam decodes every token after the first (recomputed tokens are prefill, not decode)
    assert decode <= sum(r.beam_width * (r.output_tokens - 1) for r in requests)


def test_beam_requests_need_ancestry():
    request = Request(request_id=0, arrival_s=0.0, prompt_tokens=6, output_tokens=5, beam_width=2)
    with pytest.raises(ValueError, match="no recorded beam ancestry"):
        _run(make_allocator("paged", 64, 4, 2048), [request], ancestry=None)


def test_paged_saves_more_with_wider_beams():
    saving = {}
    for width in (2, 4, 6):
        requests = [Request(i, 0.0, 30, 100, beam_width=width) for i in range(6)]
        result = _run(make_allocator("paged", 100_000, 16, 2048), requests, load_beam_ancestry())
        saved = np.array(result.steps.columns["saved_slots"], dtype=float)
        held = np.array(result.steps.columns["token_states_slots"], dtype=float)
        saving[width] = saved.sum() / (saved.sum() + held.sum())
    assert 0 < saving[2] < saving[4] < saving[6] < 1
    # Sharing the prompt alone would save 10 / 15 / 17 %: the shared ancestry saves far more.
    assert saving[2] > 0.3 and saving[4] > 0.5 and saving[6] > 0.6


def test_shipped_ancestry_table_has_the_documented_shape():
    table = read_ancestry_table()
    assert tuple(table.columns) == ANCESTRY_COLUMNS
    validate_ancestry(table)
    assert set(table["beam_width"]) == {2, 4, 6}
    assert set(table["source"]) == {"alpaca"}
    searches = table.groupby(["source", "prompt", "beam_width"], observed=True)
    assert searches.ngroups >= 3 * 48
    assert set(searches["step"].max()) == {127}  # T = 128 steps, every search
    ancestry = load_beam_ancestry()
    assert [len(ancestry[k][0][0]) for k in (2, 4, 6)] == [2, 4, 6]


def test_validate_ancestry_rejects_a_parent_out_of_range():
    table = pd.DataFrame({"source": "x", "prompt": 0, "prompt_tokens": 5, "beam_width": 2,
                          "step": [0, 0, 1, 1], "beam": [0, 1, 0, 1],
                          "parent": [0, 0, 0, 2]})  # fmt: skip
    with pytest.raises(ValueError, match="parents must lie"):
        validate_ancestry(table)


def test_search_statistics_of_a_hand_made_search():
    parents = np.array([(0, 0), (0, 0), (1, 0), (1, 1)])
    stats = search_statistics(parents)
    # Lineages as the beam at steps 0, 1, ...: step 1: (0, 0), (0, 1): they share 1 token;
    # step 2: (0, 1, 0), (0, 0, 1): still 1; step 3: both extend step 2's beam 1: (0, 0, 1, j): 3.
    assert list(stats["common_prefix"]) == [1, 1, 3]
    assert list(stats["unshared_tail"]) == [1, 2, 1]
    assert list(stats["distinct_parents"]) == [1, 2, 1]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"beam_width": 0}, "workload.beam_width=0 is invalid; expected an integer >= 1"),
    ({"beam_width": 3}, r"workload.beam_width=3 is invalid; expected 1 or a width with recorded"),
    ({"beam_width": 2, "num_samples": 2}, "1 when num_samples=2 > 1"),
])  # fmt: skip
def test_beam_width_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_workload_config(WorkloadConfig(name="alpaca", **overrides))


def test_beam_width_flows_from_the_workload_config_to_requests():
    requests = to_requests(build_workload(WorkloadConfig(name="alpaca", num_requests=5,
                                                         beam_width=4), 2048))  # fmt: skip
    assert {r.beam_width for r in requests} == {4}
    assert {r.num_samples for r in requests} == {1}


def test_small_beam_search_experiment_via_the_cli_writes_beam_width(tmp_path):
    workloads = ("alpaca_k2", "alpaca_k4", "alpaca_k6", "sharegpt_k2", "sharegpt_k4", "sharegpt_k6")
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "experiment=beam_search", "progress=false",
         "plots=false", "~workload_request_rates", f"hydra.run.dir={tmp_path}",
         *(f"workloads.{name}.num_requests=20" for name in workloads)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    assert sorted(set(summary["beam_width"])) == [2, 4, 6]
    assert set(summary["n"]) == {1}
    paged = summary[summary["allocator"] == "paged"]
    assert (paged["memory_saving_pct"] > 0).all()
    assert (paged["cow_copies"] > 0).all()
    assert (summary.loc[summary["allocator"] == "naive_oracle", "memory_saving_pct"] == 0).all()
    assert (summary["num_finished"] == 20).all()


def test_cli_names_a_bad_beam_width():
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", "workload=alpaca", "+workload.beam_width=2",
         "+workload.num_samples=2", "progress=false"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "beam_width=2 is invalid; expected 1 when num_samples=2 > 1" in done.stderr


@pytest.mark.parametrize("allocator_name", ["naive_oracle", "paged"])
def test_the_fast_path_gives_the_reference_records_on_beam_workloads(allocator_name):
    requests = [
        Request(request_id=i, arrival_s=0.3 * i, prompt_tokens=30 + 11 * i,
                output_tokens=60 + 17 * (i % 4), beam_width=(1, 2, 4, 6)[i % 4])
        for i in range(10)
    ]  # fmt: skip
    runs = []
    for fast in (True, False):
        allocator = make_allocator(allocator_name, 4096, 16, 2048)
        result = simulate(requests, Scheduler(LIMITS), allocator, COSTS, fast=fast,
                          beam_ancestry=load_beam_ancestry())  # fmt: skip
        runs.append((result, allocator.usage()))
    (fast_result, fast_usage), (ref_result, ref_usage) = runs
    assert fast_result.steps.columns == ref_result.steps.columns
    assert fast_result.requests == ref_result.requests
    assert fast_result.num_copy_on_writes == ref_result.num_copy_on_writes
    assert fast_usage == ref_usage
