"""A study: grid points (block size x preemption x workload), knees, capacity, on tiny runs."""

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.config import ConfigError
from kvbench.tasks.simulate.run import GridPoint, grid_points, point_config, run_study

TINY = (
    "workload=fixed", "workload.num_requests=40", "workload.prompt_tokens=200",
    "workload.output_tokens=100", "model=opt-13b", "hardware=a100-40gb",
    "hardware.kv_cache_gib=2", "hardware.gpu_memory_utilization=1.0", "progress=false",
)  # fmt: skip


def test_grid_is_the_product_of_the_lists_and_names_its_folders():
    cfg, _, _ = compose_config(*TINY, "block_sizes=[8,16]", "preemption_modes=[recompute,swap]")
    points = grid_points(cfg)
    assert len(points) == 4
    assert GridPoint(8, "swap").dir_name == "block_size=8,preemption=swap"
    assert GridPoint(8, "swap", "alpaca").dir_name == "workload=alpaca,block_size=8,preemption=swap"


def test_a_point_config_sets_its_values_and_drops_the_lists():
    cfg, _, raw = compose_config(*TINY, "block_sizes=[8,16]", "preemption_modes=[swap]")
    typed, point_raw = point_config(cfg, raw, GridPoint(8, "swap"))
    assert (typed.allocator.block_size, typed.scheduler.preemption) == (8, "swap")
    assert typed.block_sizes == [] and typed.preemption_modes == []
    assert point_raw.allocator.block_size == 8 and point_raw.scheduler.preemption == "swap"


def test_per_workload_rates_split_the_workloads():
    cfg, _, raw = compose_config("experiment=vllm_fig12")
    points = grid_points(cfg)
    assert [p.workload for p in points] == ["sharegpt", "alpaca"]
    typed, point_raw = point_config(cfg, raw, points[1])
    assert list(typed.workloads) == ["alpaca"] and typed.request_rates[-1] == 150.0
    assert list(point_raw.workloads) == ["alpaca"]


def test_grid_runs_each_point_in_its_folder_and_draws_the_sweeps(tmp_path):
    cfg, deployment, raw = compose_config(*TINY, "request_rates=[20]", "allocators=[paged]",
                                          "block_sizes=[16,64]",
                                          "preemption_modes=[recompute,swap]")  # fmt: skip
    summary = run_study(cfg, deployment, raw, tmp_path)
    assert sorted(zip(summary["block_size"], summary["preemption"], strict=True)) == [
        (16, "recompute"), (16, "swap"), (64, "recompute"), (64, "swap")
    ]
    for point in grid_points(cfg):
        assert (tmp_path / point.dir_name / "summary.parquet").exists()
    assert (tmp_path / "plots" / "recompute_vs_swap.png").exists()  # both modes: Fig. 19's chart
    assert not (tmp_path / "plots" / "latency_vs_block_size.png").exists()
    assert summary["num_preemptions"].sum() > 0  # 2 GiB of KV at 20 req/s: the pool preempts


@pytest.fixture(scope="module")
def capacity_run(tmp_path_factory):
    """A rate sweep with a capacity target: knees, then each allocator at its operating rate."""
    out = tmp_path_factory.mktemp("capacity")
    cfg, deployment, raw = compose_config(*TINY, "request_rates=[0.5,2,8,32]",
                                          "allocators=[naive_max,paged]",
                                          "capacity.target_request_rate=10")  # fmt: skip
    summary = run_study(cfg, deployment, raw, out)
    return out, summary


def test_rate_sweep_writes_knees_and_the_latency_chart(capacity_run):
    out, summary = capacity_run
    assert len(summary) == 8
    knees = pd.read_parquet(out / "knees.parquet").set_index("allocator")
    assert knees.loc["paged", "knee_ratio"] == 1.0
    # 2 GiB of KV hold 2,621 slots: one 2,048-slot naive_max extent, or eight 300-token requests
    # paged: paged's curve explodes at a higher rate.
    assert knees.loc["paged", "knee_rate"] > knees.loc["naive_max", "knee_rate"]
    assert (out / "plots" / "latency_vs_rate.png").stat().st_size > 0


def test_capacity_measures_each_allocator_at_its_operating_rate(capacity_run):
    out, _ = capacity_run
    fleet = pd.read_parquet(out / "capacity.parquet").set_index("allocator")
    assert fleet.loc["naive_max", "gpus"] > fleet.loc["paged", "gpus"]
    for allocator, row in fleet.iterrows():
        assert row["replicas"] >= row["replicas_from_knee"]
        assert row["gpus"] == row["replicas"] * 1
        assert row["cost_per_hour"] == pytest.approx(row["gpus"] * 2.0)  # a100-40gb list price
        assert row["kv_used_gb"] <= row["kv_held_gb"] <= row["kv_pool_gb_fleet"]
        assert row["operating_latency_s_per_token"] <= row["latency_bound_s_per_token"]
        assert (out / "operating" / f"{allocator},block_size=16,preemption=recompute"
                / "summary.parquet").exists()  # fmt: skip
    assert (out / "plots" / "capacity_cost.png").exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("block_sizes=[16,24]", "block_sizes contains 24: must be a power of two"),
        ("preemption_modes=[swap,evict]", "preemption_modes contains 'evict'"),
        ("knee.latency_multiple=1", "knee.latency_multiple=1.0: must be > 1"),
        ("knee.max_latency_s_per_token=0", "knee.max_latency_s_per_token=0.0: must be > 0"),
        ("capacity.target_request_rate=-5", "capacity.target_request_rate=-5.0"),
        ("hardware.price_per_gpu_hour=-1", "hardware.price_per_gpu_hour=-1.0"),
        ("+workload_request_rates.alpaca=[1]", "workload_request_rates.alpaca: no such workload"),
    ],
)
def test_bad_sweep_settings_are_one_line_errors(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("(", r"\(")):
        compose_config(*TINY, override)


def test_capacity_needs_a_single_workload_and_a_rate_sweep():
    with pytest.raises(ConfigError, match="sizes a fleet for one workload; this run has 2"):
        compose_config("experiment=vllm_fig2", "capacity.target_request_rate=10",
                       "request_rates=[1,2]")  # fmt: skip
    with pytest.raises(ConfigError, match="needs a rate sweep"):
        compose_config(*TINY, "capacity.target_request_rate=10", "request_rates=[1]")
