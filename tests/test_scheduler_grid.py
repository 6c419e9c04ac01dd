"""Both engines in one study (``schedulers``): v0 and v1 each a grid point, labelled, compared."""

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.config import ConfigError
from kvbench.plots.scheduler_chart import scheduler_lines
from kvbench.tasks.report.run import paper_engine_rows
from kvbench.tasks.simulate.run import grid_points, point_config, run_study

# Prompts of 1,500 tokens against a v1 budget of 512: v1 must chunk them, v0 prefills them whole.
TINY_BOTH = (
    "experiment=sharegpt_70b", "workload=fixed", "workload.num_requests=16",
    "workload.prompt_tokens=1500", "workload.output_tokens=40", "model=opt-13b",
    "hardware=a100-40gb", "hardware.num_gpus=1", "hardware.kv_cache_gib=2",
    "hardware.gpu_memory_utilization=1.0", "schedulers.vllm_v1.max_num_batched_tokens=512",
    "allocators=[naive_oracle,paged]", "progress=false", "summary_table=false",
)  # fmt: skip


def test_each_scheduler_is_a_grid_point_with_its_own_settings():
    cfg, _, raw = compose_config(*TINY_BOTH)
    points = grid_points(cfg)
    assert [point.scheduler for point in points] == ["vllm_v0", "vllm_v1"]
    assert points[1].dir_name == "scheduler=vllm_v1,block_size=16,preemption=recompute"
    typed, point_raw = point_config(cfg, raw, points[1])
    assert (typed.scheduler.name, typed.scheduler.max_num_batched_tokens) == ("vllm_v1", 512)
    raw_scheduler = point_raw.scheduler
    assert (raw_scheduler.name, raw_scheduler.max_num_batched_tokens) == ("vllm_v1", 512)
    assert typed.schedulers == {} and point_raw.schedulers == {}
    v0, _ = point_config(cfg, raw, points[0])
    assert (v0.scheduler.name, v0.scheduler.max_num_batched_tokens) == ("vllm_v0", None)


@pytest.fixture(scope="module")
def both_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("both")
    cfg, deployment, raw = compose_config(*TINY_BOTH, "request_rates=[1,16]",
                                          "capacity.target_request_rate=8")  # fmt: skip
    return out, run_study(cfg, deployment, raw, out)


def test_the_v1_point_runs_vllm_v1_and_the_v0_point_vllm_v0(both_run):
    out, summary = both_run
    assert sorted(summary["scheduler"].unique()) == ["vllm_v0", "vllm_v1"]
    for scheduler, most_prefill in (("vllm_v0", 1500), ("vllm_v1", 512)):
        steps = pd.read_parquet(
            out / f"scheduler={scheduler},block_size=16,preemption=recompute" / "steps.parquet"
        )
        assert set(steps["scheduler"]) == {scheduler}
        # v0 prefills a 1,500-token prompt in one iteration; v1 chunks it within its budget.
        assert steps["num_prefill_tokens"].max() == most_prefill


def test_knees_fleet_and_chart_are_per_scheduler(both_run):
    out, _ = both_run
    knees = pd.read_parquet(out / "knees.parquet")
    assert sorted(zip(knees["scheduler"], knees["allocator"], strict=True)) == [
        ("vllm_v0", "naive_oracle"), ("vllm_v0", "paged"),
        ("vllm_v1", "naive_oracle"), ("vllm_v1", "paged"),
    ]  # fmt: skip
    # knee_ratio compares allocators under the same scheduler: each scheduler's paged is 1.
    assert list(knees.loc[knees["allocator"] == "paged", "knee_ratio"]) == [1.0, 1.0]
    fleet = pd.read_parquet(out / "capacity.parquet")
    assert len(fleet) == 4 and fleet.groupby("scheduler")["allocator"].nunique().eq(2).all()
    for row in fleet.itertuples(index=False):
        if row.replicas == row.replicas:  # measured at its operating rate, under its scheduler
            folder = out / "operating" / (f"{row.allocator},scheduler={row.scheduler},"
                                          "block_size=16,preemption=recompute")  # fmt: skip
            measured = pd.read_parquet(folder / "summary.parquet")
            assert set(measured["scheduler"]) == {row.scheduler}
    assert (out / "plots" / "scheduler_comparison.png").stat().st_size > 0


def test_the_chart_draws_one_line_per_allocator_and_scheduler():
    summary = pd.DataFrame({
        "workload": ["w"] * 6, "allocator": ["paged", "paged", "naive_max"] * 2,
        "scheduler": ["vllm_v0"] * 3 + ["vllm_v1"] * 3, "request_rate": [2.0, 1.0, 1.0] * 2,
    })  # fmt: skip
    lines = scheduler_lines(summary)
    assert [(a, s, list(rows["request_rate"])) for _, a, s, rows in lines] == [
        ("paged", "vllm_v0", [1.0, 2.0]), ("naive_max", "vllm_v0", [1.0]),
        ("paged", "vllm_v1", [1.0, 2.0]), ("naive_max", "vllm_v1", [1.0]),
    ]  # fmt: skip


def test_the_reproduction_reads_the_papers_engine_only():
    table = pd.DataFrame({"scheduler": ["vllm_v0", "vllm_v1", None], "x": [1, 2, 3]})
    assert list(paper_engine_rows(table)["x"]) == [1, 3]
    assert list(paper_engine_rows(table.drop(columns="scheduler"))["x"]) == [1, 2, 3]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("schedulers.vllm_v1.name=vllm_v0", "schedulers names vllm_v0, vllm_v0"),
        ("allocators=[radix]", "scheduler=vllm_v1 runs"),
        ("schedulers.vllm_v1.max_num_batched_tokens=8", "vllm_v1 needs a token budget"),
    ],
)
def test_every_scheduler_of_the_grid_is_validated(override, expected):
    with pytest.raises(ConfigError, match=expected):
        compose_config(*TINY_BOTH, override)
